"""`serve`'s handlers of SIGTERM, SIGINT and SIGHUP: a stop reaches the scheduler's loop and the night in flight.

A handler runs between two bytecodes of the main thread, where the scheduler may be in the middle of
a round of due jobs: it only notes the stop, for the loop to return between two rounds, and passes
the signal on to the night, which rolls back its iteration.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator

from orchestrator.cancel import StopNoted, stopping_signals
from orchestrator.night_child import fresh_night_in_flight
from orchestrator.scheduler_loops import ForegroundScheduler


@contextlib.contextmanager
def stop_on_signals(scheduler: ForegroundScheduler, early: StopNoted) -> Iterator[None]:
    """SIGTERM, SIGINT and SIGHUP stop the scheduler's loop and reach the night in flight; after, they change nothing.

    `serve` is then leaving with its code (0) decided. The default handlers put back would make a
    late Ctrl-C a KeyboardInterrupt (exit 130) and a late SIGTERM a death by signal. A handler that
    does nothing, not SIG_IGN: an ignored signal stays ignored in every process started after it.
    """
    with fresh_night_in_flight() as night:

        def stop(signum: int, frame: object) -> None:
            # Runs between two bytecodes of the main thread: no logging here (it may hold the stream's lock).
            night.stop(signum)
            scheduler.stop_requested = signal.Signals(signum).name

        numbers = stopping_signals()
        for number in numbers:
            signal.signal(number, stop)
        # Asked while serve started up: its loop returns before it processes anything, a night due now included.
        scheduler.stop_requested = scheduler.stop_requested or early.signal
        try:
            yield
        finally:
            for number in numbers:
                signal.signal(number, _changes_nothing)


def _changes_nothing(signum: int, frame: object) -> None:
    """A stopping signal once serve has stopped: see `stop_on_signals`."""
