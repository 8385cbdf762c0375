"""`overnight serve`: start each night from `[schedule] cron`, surviving restarts of the host.

The schedule lives in the run store's database (its own table), so a host that
was down at 01:30 still starts the missed night when it comes back within
`misfire_grace_s`, and never starts it twice: `coalesce` folds several missed
fire times into one, `max_instances = 1` refuses a second concurrent night.

Each night runs as a child `overnight run` process: a crash or a leak in one
night never takes the scheduler down, and the state lock in `run` makes a night
started while another holds the state dir exit 75 at once.
"""

from __future__ import annotations

import pickle
import re
import signal
import subprocess
import sys
from datetime import datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any

from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
    EVENT_SCHEDULER_STARTED,
    JobEvent,
)
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import STATE_STOPPED, BaseScheduler
from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.cron import CronTrigger

from orchestrator.config import Config, load_config
from orchestrator.errors import ConfigError, StateError
from orchestrator.logs import get_logger

NIGHT_JOB_ID = "overnight-night"
SCHEDULE_TABLE = "overnight_schedule"
# Referenced by import path: a persistent job store pickles the reference, not the function.
NIGHT_JOB = "orchestrator.schedule:run_scheduled_night"



def _logger() -> Any:
    # Fetched per event: a logger bound at import would keep the logging setup of import time.
    return get_logger(component="schedule")


class _NoFiresAfterShutdown:
    """APScheduler 3 wakes its loop once more after `shutdown()` and processes due jobs.

    Their executor is already shut down, so the submission fails, yet the job's next
    run time is advanced and stored: the due night would be lost, not run at the next start.
    """

    def _process_jobs(self) -> float | None:
        if self.state == STATE_STOPPED:  # type: ignore[attr-defined]
            return None
        return super()._process_jobs()  # type: ignore[misc]


class _ForegroundScheduler(_NoFiresAfterShutdown, BlockingScheduler):
    pass


class _BackgroundScheduler(_NoFiresAfterShutdown, BackgroundScheduler):
    pass


def run_scheduled_night(config_path: str) -> int:
    """One night as a child `overnight run`; its exit code (75 when another night holds the lock)."""
    command = [sys.executable, "-m", "orchestrator.cli", "run", "--config", config_path]
    _logger().info("scheduled_night_started", config=config_path)
    # stdin closed: nothing in a night may wait for a person.
    finished = subprocess.run(command, stdin=subprocess.DEVNULL, check=False)
    _logger().info("scheduled_night_finished", config=config_path, exit_code=finished.returncode)
    return finished.returncode


def build_scheduler(
    config: Config, config_path: Path, *, blocking: bool = True, job: str = NIGHT_JOB
) -> BaseScheduler:
    """A scheduler holding the night job in the run store's database; not started.

    `job` is the import path of what a fire calls; tests point it at a marker.
    """
    zone = schedule_timezone(config)
    trigger = night_trigger(config, zone)
    store = _job_store(config.store_url)
    scheduler_class = _ForegroundScheduler if blocking else _BackgroundScheduler
    scheduler = scheduler_class(
        jobstores={"default": store},
        job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": config.schedule.misfire_grace_s},
        timezone=zone,
    )
    extra: dict[str, Any] = {}
    pending = _stored_next_run_time(store, trigger)
    if pending is not None:
        # Replacing the job would otherwise recompute its next run from now and lose a missed night.
        extra["next_run_time"] = pending
    scheduler.add_job(
        job,
        trigger,
        args=[str(Path(config_path).resolve())],
        id=NIGHT_JOB_ID,
        name="overnight night",
        replace_existing=True,
        **extra,
    )
    scheduler.add_listener(_log_unusual_fire, EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES | EVENT_JOB_ERROR)
    return scheduler


class _StopBeforeStart(Exception):
    """A signal arrived before the scheduler ran: there is nothing to shut down."""


def serve(config_path: Path) -> int:
    """Run the scheduler in the foreground until SIGTERM or SIGINT; 0 on a clean stop."""
    config = load_config(config_path)
    scheduler = build_scheduler(config, config_path, blocking=True)

    def stop(signum: int, frame: object) -> None:
        _logger().info("scheduler_stopping", signal=signal.Signals(signum).name)
        if not scheduler.running:
            raise _StopBeforeStart
        # wait=False: a night in flight gets its own SIGTERM from the service manager's process group.
        scheduler.shutdown(wait=False)

    def started(event: object) -> None:
        upcoming = next_fire_times(config, count=1)
        _logger().info(
            "scheduler_started",
            cron=config.schedule.cron,
            timezone=str(schedule_timezone(config)),
            next_fire_time=upcoming[0].isoformat() if upcoming else None,
            store=_safe_url(config.store_url),
        )

    scheduler.add_listener(started, EVENT_SCHEDULER_STARTED)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        scheduler.start()
    except _StopBeforeStart:
        pass
    _logger().info("scheduler_stopped")
    return 0


def next_fire_times(config: Config, count: int = 3, *, now: datetime | None = None) -> list[datetime]:
    """The next `count` night starts after `now`, in the schedule's time zone."""
    zone = schedule_timezone(config)
    trigger = night_trigger(config, zone)
    moment = now or datetime.now(zone)
    times: list[datetime] = []
    previous: datetime | None = None
    while len(times) < count:
        upcoming = trigger.get_next_fire_time(previous, moment)
        if upcoming is None:  # e.g. "0 0 30 2 *": never
            break
        times.append(upcoming)
        previous, moment = upcoming, upcoming + timedelta(seconds=1)
    return times


def schedule_timezone(config: Config) -> tzinfo:
    """`[schedule] timezone`: an IANA name, or "local" for the host's zone."""
    name = config.schedule.timezone
    if name == "local":
        from tzlocal import get_localzone

        return get_localzone()
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"{config.source}: [schedule] timezone: unknown time zone {name!r}") from None


def night_trigger(config: Config, zone: tzinfo) -> CronTrigger:
    """The cron trigger, given its zone: a CronTrigger ignores the scheduler's zone otherwise."""
    expression = config.schedule.cron
    fields = expression.split()
    if len(fields) != 5:
        raise ConfigError(
            f"{config.source}: [schedule] cron: {expression!r} needs 5 fields (minute hour day month weekday), got {len(fields)}"
        )
    try:
        fields[4] = crontab_weekdays(fields[4])
        return CronTrigger.from_crontab(" ".join(fields), timezone=zone)
    except ValueError as exc:
        raise ConfigError(f"{config.source}: [schedule] cron: {expression!r}: {_first_line(exc)}") from None


def crontab_weekdays(field: str) -> str:
    """Crontab weekday numbers (0 or 7 = Sunday) as names, for APScheduler 3.x (0 = Monday).

    APScheduler 3's `from_crontab` reads "1-5" as Tuesday to Saturday; names mean
    the same to both. Parts with names pass through unchanged.
    """
    names = ",".join(_weekday_part(part) for part in field.split(","))
    return ",".join(dict.fromkeys(names.split(",")))


_WEEKDAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat", "sun")
_NUMERIC_PART = re.compile(r"^(\*|\d+(?:-\d+)?)(?:/(\d+))?$")


def _weekday_part(part: str) -> str:
    match = _NUMERIC_PART.match(part)
    if match is None or part == "*":
        return part
    span, step_text = match.groups()
    step = int(step_text) if step_text else 1
    if span == "*":
        first, last = 0, 6
    elif "-" in span:
        first, last = (int(value) for value in span.split("-"))
    else:
        first = last = int(span)
        if step_text:  # "5/2" means 5 to the end, stepping 2
            last = 6
    if not (0 <= first <= 7 and 0 <= last <= 7) or first > last or step < 1:
        raise ValueError(f"weekday {part!r} is not within 0-7 (0 and 7 are Sunday)")
    return ",".join(_WEEKDAY_NAMES[day] for day in range(first, last + 1, step))


def _stored_next_run_time(store: SQLAlchemyJobStore, trigger: CronTrigger) -> datetime | None:
    """When the stored night job is next due, if it keeps the same schedule."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        store.jobs_t.create(store.engine, checkfirst=True)
        stored = store.lookup_job(NIGHT_JOB_ID)
    except SQLAlchemyError as exc:
        raise StateError(f"schedule store {_safe_url(str(store.engine.url))}: {_first_line(exc)}") from exc
    except (LookupError, ImportError, AttributeError, ValueError, pickle.UnpicklingError):
        # The stored reference no longer imports: the job is rebuilt from the config.
        return None
    if stored is None or repr(stored.trigger) != repr(trigger):
        return None
    return stored.next_run_time


def _job_store(url: str) -> SQLAlchemyJobStore:
    """A job store on the run store's database; SQLite waits for the night's writes instead of failing."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    options: dict[str, Any] = {"pool_pre_ping": True}
    if parsed.get_backend_name() == "sqlite":
        options = {"connect_args": {"timeout": 30}}
        database = parsed.database or ""
        if database and database != ":memory:" and not database.startswith("file:"):
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    try:
        return SQLAlchemyJobStore(url=url, tablename=SCHEDULE_TABLE, engine_options=options)
    except ImportError as exc:  # the URL names a driver that is not installed
        raise StateError(f"schedule store {_safe_url(url)}: {exc}") from exc


def _log_unusual_fire(event: JobEvent) -> None:
    """Missed, refused and failed fires, as named events instead of APScheduler's stdlib warnings."""
    names = {
        EVENT_JOB_MISSED: "scheduled_night_missed",
        EVENT_JOB_MAX_INSTANCES: "scheduled_night_skipped_overlap",
        EVENT_JOB_ERROR: "scheduled_night_failed",
    }
    details: dict[str, Any] = {"job": event.job_id}
    run_time = getattr(event, "scheduled_run_time", None)
    if run_time is not None:
        details["scheduled_for"] = run_time.isoformat()
    exception = getattr(event, "exception", None)
    if exception is not None:
        details["error"] = _first_line(exception)
    _logger().warning(names.get(event.code, "scheduled_night_event"), **details)


def _first_line(exc: BaseException) -> str:
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    return lines[0] if lines else type(cause).__name__


def _safe_url(url: str) -> str:
    """The URL without its password, for logs."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL has no password we could find either
        return url


__all__ = [
    "NIGHT_JOB_ID",
    "SCHEDULE_TABLE",
    "build_scheduler",
    "crontab_weekdays",
    "next_fire_times",
    "run_scheduled_night",
    "schedule_timezone",
    "serve",
]
