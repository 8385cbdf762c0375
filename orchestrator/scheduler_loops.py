"""APScheduler's loops, changed so that a stop never loses a night that falls due as it comes.

APScheduler 3 advances and stores a job's next run time even when the night's submission fails:
a `shutdown()` from a signal handler in the middle of a round of due jobs, or one more round after
`shutdown()`, would lose that night instead of leaving it due for the next `serve`.
"""

from __future__ import annotations

import math
import time

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import STATE_STOPPED
from apscheduler.schedulers.blocking import BlockingScheduler

from orchestrator.schedule_events import first_line, logger

# How soon the foreground loop notices a stop request (a signal handler may not wake it: see below).
_STOP_POLL_S = 0.25
# How long the loop waits before it asks a job store that failed again.
_STORE_RETRY_S = 5.0


class ForegroundScheduler(BlockingScheduler):
    """Stops between two rounds of due jobs, never inside one.

    APScheduler's `shutdown()` called from a signal handler runs in the middle of
    `_process_jobs` when the signal comes just as a night falls due: the submission
    then fails, while the job's next run time has already moved on, and the night is lost.
    So a signal only sets `stop_requested`, and `serve` shuts down once the loop has returned.
    """

    stop_requested: str | None = None

    def _main_loop(self) -> None:
        due_at = 0.0  # wall clock, so that a host waking from sleep processes at once
        while not self.stop_requested:
            # Polled, because the handler must not set the event: the main thread may hold its lock.
            woken = self._event.wait(min(max(due_at - time.time(), 0.0), _STOP_POLL_S))
            if self.stop_requested:
                break
            if woken or time.time() >= due_at:
                self._event.clear()
                try:
                    wait_s = self._process_jobs()
                except Exception as exc:  # the job store failed (a locked or unreachable database)
                    # A night may have started before its next fire time could be stored: the
                    # next round finds it due again, and run_scheduled_night skips a night done.
                    logger().error("scheduler_store_failed", error=first_line(exc), retry_in_s=_STORE_RETRY_S)
                    wait_s = _STORE_RETRY_S
                due_at = math.inf if wait_s is None else time.time() + wait_s


class BackgroundSchedulerForTests(BackgroundScheduler):
    """For tests. APScheduler 3 wakes its loop once more after `shutdown()` and processes due jobs.

    Their executor is already shut down, so the submission fails, yet the job's next
    run time is advanced and stored: the due night would be lost, not run at the next start.
    """

    def _process_jobs(self) -> float | None:
        if self.state == STATE_STOPPED:
            return None
        return super()._process_jobs()
