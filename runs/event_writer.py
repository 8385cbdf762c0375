"""Events (model calls, tool calls, signals) written from a background thread, many per transaction.

Events are the hot path: several per model call, from up to N agent threads
at once. Written one transaction each, they cost more CPU than the HTTP call
they record, and every agent thread would wait on SQLite. Here an agent
thread only queues the row; one writer thread takes whatever has queued up
and inserts it in one transaction.

What stays true: the run store's reads, and its writes that close something
(an iteration or a run ended), first wait for the queue to drain (`flush`), so
the database never says an iteration ended before its events are in. A crash loses at most the
events of the last few tens of milliseconds, which the recovery treats as it always
did: the iteration was in flight. A database failure (disk full, read-only)
is raised as StateError to the next caller of `put` or `flush`; the batch it
hit is rolled back whole.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Callable

from orchestrator.errors import StateError

# One transaction never takes more rows than this, so a flush never waits long behind a huge batch.
MAX_BATCH = 500
# After the first queued row, the writer waits this long for more (unless someone flushes):
# it then writes while the agent threads wait on the model, not while they want the GIL.
LINGER_S = 0.025
_STOP = object()


class EventWriter:
    def __init__(
        self,
        write: Callable[[list[dict[str, Any]], dict[int, Any]], None],
        describe: Callable[[BaseException], str],
        *,
        write_lock: Any = None,
    ) -> None:
        # write(rows, {iteration_id: beat_at}): one transaction (runs/event_batches.py).
        self._write = write
        self._describe = describe
        # Held around each batch's transaction: the store's own writes take it too.
        self._write_lock = write_lock if write_lock is not None else contextlib.nullcontext()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._failure: StateError | None = None
        self._hurry = threading.Event()

    def put(self, row: dict[str, Any], *, beat: bool = False) -> None:
        """Queue one events row (and, if `beat`, a heartbeat of its iteration at the row's time)."""
        self._raise_failure()
        self._start_once()
        self._queue.put((row, beat))

    def flush(self) -> None:
        """Wait until every queued row is written; raise the failure of any of them."""
        if self._thread is not None:
            self._hurry.set()
            self._queue.join()
        self._raise_failure()

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(_STOP)
            self._hurry.set()
            thread.join()

    def _start_once(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="run-store-events", daemon=True)
                self._thread.start()

    def _raise_failure(self) -> None:
        with self._lock:
            failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            if batch[0] is not _STOP:
                self._hurry.wait(LINGER_S)
            # Cleared before the queue is drained: a flush after this point is seen by the next round.
            self._hurry.clear()
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            items = [item for item in batch if item is not _STOP]
            try:
                if items:
                    self._write_batch(items)
            finally:
                for _ in batch:
                    self._queue.task_done()
            if any(item is _STOP for item in batch):
                return

    def _write_batch(self, items: list[tuple[dict[str, Any], bool]]) -> None:
        rows = [row for row, _ in items]
        # One beat per iteration: its latest.
        beats = {row["iteration_id"]: row["at"] for row, beat in items if beat}
        try:
            with self._write_lock:
                self._write(rows, beats)
        except Exception as exc:  # whatever it is, the writer thread must live on, or every flush would wait forever
            with self._lock:
                self._failure = self._failure or StateError(f"run store: recording events failed: {self._describe(exc)}")
