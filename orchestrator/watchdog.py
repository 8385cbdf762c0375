"""The silence watchdog: a model silent past `request_timeout_s` ends as `QualityError("watchdog_timeout")`.

A socket's read timeout alone cannot tell: litellm drops a proxy's keep-alive comments unseen,
and they reset its timeout, so a server that sends them for ever was never silent. Its stream
is read in a helper thread and watched from the caller's (`run_watched`), which judges silence
by the time since the last chunk that added to the answer and cuts the stream. And silence is
the model's only while its server answers beside it at once (`server_stall`): a stopped or
stalled server is an outage, for the retries.
"""

from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar

from orchestrator import server_probes
from orchestrator.errors import Cancelled, QualityError
from orchestrator.records import ModelResponse
from orchestrator.runaway import runaway_output

if TYPE_CHECKING:  # pydantic is not needed to import this module
    from orchestrator.config import ModelConfig

T = TypeVar("T")

WATCHDOG_CORRECTION = (
    "The model went silent for too long. Keep each reply short and make one tool call at a time."
)

# How often a waiting caller looks at the cancel token (and, under litellm, at the stream's silence).
_CANCEL_POLL_S = 0.1
# How long a server silent for request_timeout_s has to answer a GET / before its silence is its own.
# Long enough for a busy server whose request threads are all taken to free one.
_PROBE_S = 30.0
# A live server answers a GET from another thread at once; one slower than this was stalled too.
_PROMPT_ANSWER_S = 2.0
# How long a watched reader has to end once its stream was found silent and cut.
_CUT_GRACE_S = 1.0


def watchdog_timeout(limit: float) -> QualityError:
    return QualityError("watchdog_timeout", WATCHDOG_CORRECTION, evidence=f"no output for {limit:g} s")


class Watch:
    """What a thread reading a stream shows the thread watching it: the stream, and when its last chunk came."""

    def __init__(self) -> None:
        self.stream: Any = None
        self.last_chunk = 0.0  # any chunk: the bytes of one event are counted from it
        self.last_said = 0.0  # a chunk that added to the answer: silence is counted from it
        # Set by the watcher when it cut the stream: what the reader raises instead of the cut's error.
        self.verdict: QualityError | None = None
        self._chunk_seen = -1.0
        self._bytes_at_chunk = 0

    def begin(self, stream: Any, now: float) -> None:
        self.last_chunk = self.last_said = now
        self.stream = stream

    def bytes_since_chunk(self) -> int:
        """Bytes read since the last chunk, as of the watcher's last look (the reader does not count them)."""
        read = self.stream.bytes_read() if hasattr(self.stream, "bytes_read") else 0
        if self.last_chunk != self._chunk_seen:
            self._chunk_seen, self._bytes_at_chunk = self.last_chunk, read
        return read - self._bytes_at_chunk

    def cut(self) -> bool:
        """Shut the stream's connection, so a read blocked on it returns; False when it cannot be cut."""
        cut = getattr(self.stream, "cut", None)
        return bool(cut()) if cut is not None else False


class InThread(Generic[T]):
    """`work()` run in a daemon helper thread, so that the thread waiting for it can give it up (a cancel, silence);
    its answer, or what it raised, is handed to that thread by `result()`."""

    def __init__(self, work: Callable[[], T], *, name: str) -> None:
        self.done = threading.Event()
        self._answer: T | None = None
        self.error: BaseException | None = None
        threading.Thread(target=self._run, args=(work,), name=name, daemon=True).start()

    def _run(self, work: Callable[[], T]) -> None:
        try:
            self._answer = work()
        except BaseException as exc:  # raised in the waiting thread, by result()
            self.error = exc
        finally:
            self.done.set()

    def result(self) -> T:
        """What `work()` returned, or raises what it raised; only once `done` is set."""
        if self.error is not None:
            raise self.error
        return self._answer  # type: ignore[return-value]


def run_watched(
    attempt: Callable[[Watch], ModelResponse], *, silence_limit: float, event_limit: int, cancel: Any
) -> ModelResponse:
    """`attempt` in a helper thread, watched from this one for a cancel and for silence.

    The watcher judges silence by the time since the last chunk and cuts the stream's
    socket. On a cancel the stream is cut too, and its reader given up to _CUT_GRACE_S to raise the cancel with the
    tokens it used; one it cannot cut, or slower, is abandoned (a daemon; it ends at its read timeout).
    """
    watch = Watch()
    call = InThread(lambda: attempt(watch), name="model-call")
    while not call.done.wait(_CANCEL_POLL_S):
        if cancel is not None and cancel.cancelled:
            # A cut reader raises the cancel itself, with the tokens its answer had used (spent all the same).
            if watch.cut() and call.done.wait(_CUT_GRACE_S) and isinstance(call.error, Cancelled):
                raise call.error
            cancel.raise_if_cancelled()
        verdict = _verdict(watch, silence_limit, event_limit)
        # A cut stream's reader raises the verdict itself, with the tokens it used; one that could
        # not be cut has _CUT_GRACE_S to end on its own (its read timeout), then is abandoned.
        if verdict is not None and not call.done.wait(_CUT_GRACE_S):
            raise verdict
    return call.result()


def _verdict(watch: Watch, silence_limit: float, event_limit: int) -> QualityError | None:
    """What stops the watched stream, cutting it: nothing said for silence_limit (watchdog_timeout), or
    more bytes since the last chunk than one event could need (runaway_output, one line without end)."""
    if watch.stream is None or watch.verdict is not None:
        return None
    if time.monotonic() - watch.last_said > silence_limit:
        verdict = watchdog_timeout(silence_limit)
    elif watch.bytes_since_chunk() > event_limit:
        verdict = runaway_output(f"one event passed {event_limit} bytes without ending")
    else:
        return None
    # Set before the cut: the reader it wakes may run on before this thread does.
    watch.verdict = verdict
    if not watch.cut():
        watch.verdict = None  # no cut, no reader woken early: the verdict is raised here after the grace
    return verdict


def server_stall(config: ModelConfig, cancel: Any) -> str | None:
    """Why a model's silence is its server's, asked with a `GET /` beside it; None when the server answered at once.

    A server stopped, wedged or stalled takes connections (the kernel does) and answers late
    or never: its silence was blamed on the model as watchdog_timeout, with a note telling the
    next attempt to write less, and the task parked.
    """
    if cancel is not None:
        cancel.raise_if_cancelled()
    probe_s = min(_PROBE_S, config.request_timeout_s)
    took = asked_unless_cancelled(lambda: server_probes.server_answer_time(config.api_base, probe_s), cancel)
    if took is None or took <= _PROMPT_ANSWER_S:
        return None
    silent = f"no output for {config.request_timeout_s:g} s, and the server"
    if took == math.inf:
        return f"{silent} answered no GET / in {probe_s:g} s (stopped, wedged or gone)"
    return f"{silent} took {took:.1f} s to answer a GET / (stalled or overloaded)"


def asked_unless_cancelled(ask: Callable[[], T], cancel: Any) -> T:
    """`ask()` (a request to the server beside the chat) in a helper thread, given up at a cancel (raising it): a
    SIGTERM while a stopped server was asked waited for the request's whole timeout (up to _PROBE_S) before the
    night could stop. The abandoned request is a daemon; it ends at its own timeout. Nothing is sent once cancelled."""
    if cancel is not None:
        cancel.raise_if_cancelled()
    asking = InThread(ask, name="server-probe")
    while not asking.done.wait(_CANCEL_POLL_S):
        if cancel is not None:
            cancel.raise_if_cancelled()
    if cancel is not None:
        cancel.raise_if_cancelled()  # a SIGTERM as the request ended still ends the iteration as cancelled
    return asking.result()
