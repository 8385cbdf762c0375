"""The night job's store: a table of the run store's own database, so that the schedule survives restarts.

A host that was down at the fire, or a `serve` restarted, finds the night's pending fire time there;
the table is one per state dir where several machines share a `[store] url`, and a night `serve`'s
stop ended is put back in it, due, for the next `serve`.
"""

from __future__ import annotations

import pickle
from datetime import datetime
from pathlib import Path
from typing import Any

from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.triggers.base import BaseTrigger

from orchestrator.config import Config
from orchestrator.errors import StateError
from orchestrator.lock import make_dir, state_identity
from orchestrator.schedule_events import first_line, logger
from runs.engine import safe_url

NIGHT_JOB_ID = "overnight-night"
SCHEDULE_TABLE = "overnight_schedule"


def schedule_table(config: Config) -> str:
    """The job store's table: its own per state dir in a `[store] url` several may share.

    Every APScheduler runs every job in its table: one table shared by two machines' `serve`
    would start each machine's night on both, with the other's config path.
    """
    if config.store.url is None:  # the state dir's own SQLite file
        return SCHEDULE_TABLE
    make_dir(config.state_dir)
    return f"{SCHEDULE_TABLE}_{state_identity(config.state_dir)}"


def job_store(config: Config) -> SQLAlchemyJobStore:
    """A job store on the run store's database; SQLite waits for the night's writes instead of failing."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from runs.engine import BUSY_TIMEOUT_MS, postgres_bounds

    url = config.store_url
    parsed = make_url(url)
    options: dict[str, Any] = {"pool_pre_ping": True}
    if parsed.get_backend_name() == "postgresql":
        # As the run store's: a partition would otherwise hang the scheduler's thread, and no night would fire again.
        options["connect_args"] = postgres_bounds(parsed)
    elif parsed.get_backend_name() == "sqlite":
        # The URL's `?timeout=S`, as the run store has it: connect_args would overwrite it.
        options = {} if "timeout" in parsed.query else {"connect_args": {"timeout": BUSY_TIMEOUT_MS / 1000}}
        database = parsed.database or ""
        if database and database != ":memory:" and not database.startswith("file:"):
            make_dir(Path(database).expanduser().parent)  # a file in the way: StateError, one line
    try:
        return SQLAlchemyJobStore(url=url, tablename=schedule_table(config), engine_options=options)
    # A driver not installed, a dialect SQLAlchemy does not know, a query argument the driver cannot take.
    except (ImportError, ArgumentError, ValueError, TypeError) as exc:
        raise StateError(f"schedule store {safe_url(url)}: {exc}") from exc


def stored_next_run_time(store: SQLAlchemyJobStore, trigger: BaseTrigger) -> datetime | None:
    """When the stored night job is next due, if it keeps the same schedule."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        store.jobs_t.create(store.engine, checkfirst=True)
        stored = store.lookup_job(NIGHT_JOB_ID)
    except SQLAlchemyError as exc:
        raise StateError(f"schedule store {safe_url(str(store.engine.url))}: {first_line(exc)}") from exc
    except (LookupError, ImportError, AttributeError, ValueError, pickle.UnpicklingError):
        # The stored reference no longer imports: the job is rebuilt from the config.
        return None
    if stored is None or repr(stored.trigger) != repr(trigger):
        return None
    # Kept by the zone's clock (a pickled datetime is its local time and the zone's name): an update of the zone
    # database moves it with the new rules. A time the old rules put off (a skipped 02:30 kept as 03:30) stays put for
    # that one night: worked out again from now, a restart inside the hour between would skip the night.
    return stored.next_run_time


def keep_due(config: Config, run_time: datetime) -> None:
    """Put back the fire time of a night serve's stop ended, so that the next `serve` starts it (within the grace)."""
    store = job_store(config)
    try:
        job = store.lookup_job(NIGHT_JOB_ID)
        if job is not None:
            job.next_run_time = run_time
            store.update_job(job)
    finally:
        store.shutdown()
    logger().info("scheduled_night_kept_due", scheduled_for=run_time.isoformat())
