"""`serve`'s log events, APScheduler's own warnings among them, under stable names.

Log pipelines match on event names, and with `--log-format json` stderr must carry nothing but
JSON lines: APScheduler's stdlib warnings (a missed fire, an overlap, a job store it cannot read)
are turned into our events here, once, for every part of `serve` that logs.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobEvent

from orchestrator.logs import get_logger

# The fires `log_unusual_fire` names, as a scheduler listener's mask.
UNUSUAL_FIRES = EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES | EVENT_JOB_ERROR


def logger() -> Any:
    # Fetched per event: a logger bound at import would keep the logging setup of import time.
    return get_logger(component="schedule")


def first_line(exc: BaseException) -> str:
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    return lines[0] if lines else type(cause).__name__


def log_unusual_fire(event: JobEvent) -> None:
    """Missed, refused and failed fires, as named events instead of APScheduler's stdlib warnings."""
    names = {
        EVENT_JOB_MISSED: "scheduled_night_missed",
        EVENT_JOB_MAX_INSTANCES: "scheduled_night_skipped_overlap",
        EVENT_JOB_ERROR: "scheduled_night_failed",
    }
    details: dict[str, Any] = {"job": event.job_id}
    # A refused (overlapping) fire carries its times as a list (JobSubmissionEvent), the others one.
    run_times = getattr(event, "scheduled_run_times", None) or [getattr(event, "scheduled_run_time", None)]
    if run_times[-1] is not None:
        details["scheduled_for"] = run_times[-1].isoformat()
    exception = getattr(event, "exception", None)
    if exception is not None:
        details["error"] = first_line(exception)
    logger().warning(names.get(event.code, "scheduled_night_event"), **details)


class _LibraryWarnings(logging.Handler):
    """APScheduler's own warnings and errors as our events: stderr stays JSON lines in JSON mode."""

    # Already logged under stable names by `log_unusual_fire`: missed, refused (overlap), failed.
    _COVERED = ("Run time of job ", "Execution of job ", 'Job "')

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith(self._COVERED):
            return
        details: dict[str, Any] = {"logger": record.name, "message": (record.getMessage().splitlines() or [""])[0]}
        if record.exc_info and record.exc_info[1] is not None:
            details["error"] = first_line(record.exc_info[1])
        log = logger()
        (log.error if record.levelno >= logging.ERROR else log.warning)("scheduler_library_warning", **details)


@contextlib.contextmanager
def library_logs_as_events() -> Iterator[None]:
    library = logging.getLogger("apscheduler")
    handler = _LibraryWarnings(logging.WARNING)
    propagate = library.propagate
    library.addHandler(handler)
    library.propagate = False  # not also as plain lines through the root logger
    try:
        yield
    finally:
        library.removeHandler(handler)
        library.propagate = propagate
