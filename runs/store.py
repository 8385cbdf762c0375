"""The run store: what happened each night, written as it happens, and how it is opened.

Every state change (a run, task or iteration begun or ended, a lease) commits
at once in its own short transaction, so another process (the CLI's `report`,
a second night after a crash) sees it immediately. Events (model calls, tool
calls, signals) are queued and written a few at a time by runs/event_writer.py;
every state change first waits for them, so the store never shows an iteration
ended before its events.

RunStore is its parts, each a module with one job, all writing and reading through
runs/store_transactions.py: a night's rows (runs/run_writes.py), leases (runs/lease_rows.py),
a dead night's recovery (runs/recovery_rows.py), the notes.md entries owed (runs/owed_note_rows.py),
the reads for the report (runs/run_reads.py) and upkeep (runs/store_upkeep.py). This module opens it:
the database comes from runs/engine.py (the engine a `[store] url` makes), its tables from
runs/schema.py (created, or brought up to this version's), and in a PostgreSQL store the database's
clock is measured against this host's.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from datetime import timedelta, timezone
from pathlib import Path

from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from orchestrator.errors import StateError
from runs.engine import database_complaint, make_engine, safe_url, sqlite_database_file, sqlite_uri, sqlite_url
from runs.lease_rows import LeaseRows
from runs.models import utc_now
from runs.owed_note_rows import OwedNoteRows
from runs.recovery_rows import RecoveryRows
from runs.run_reads import RunReads
from runs.run_writes import RunWrites
from runs.schema import TableBusy, create_schema, lacks_columns
from runs.store_upkeep import StoreUpkeep

__all__ = ["RunStore"]


class RunStore(RunWrites, LeaseRows, RecoveryRows, OwedNoteRows, RunReads, StoreUpkeep):
    """Runs, task runs, iterations and their events, in one SQL database."""

    @classmethod
    def open(cls, url: str, *, reading: bool = False) -> RunStore:
        """Connect and create missing tables; StateError (one line) if the store cannot be used. `reading` (only
        reads follow): a column an older version's store lacks and the role may not add is read as null."""
        engine: Engine | None = None
        try:
            engine = make_engine(url)
            left_out = create_schema(engine, reading=reading)
        # ImportError: the URL names a database driver that is not installed; ValueError, TypeError:
        # a query argument the driver cannot take (`?timeout=abc`), should one get past the config's check.
        except (SQLAlchemyError, OSError, ImportError, ValueError, TypeError, TableBusy) as exc:
            if engine is not None:
                engine.dispose()
            raise StateError(f"cannot open run store {safe_url(url)}: {database_complaint(exc)}") from exc
        store = cls(engine)
        store.read_without(left_out)
        if store._database_clock:
            store._clock_offset = _database_clock_offset(engine, url)
        return store

    @classmethod
    def open_for_reading(cls, url: str) -> RunStore | None:
        """`open`, or, for a SQLite file that cannot be opened for writing (the file system went
        read-only in the night), the file as it is: the morning can still read its account.
        None when the SQLite file does not exist yet: reading creates nothing."""
        database = sqlite_database_file(url)
        if database is not None and not database.exists():
            return None
        try:
            return cls.open(url, reading=True)
        except StateError:
            if database is None or not database.is_file():
                raise
        # immutable: no lock, no -shm file, no WAL read (a clean close leaves none to read). A URL made, not parsed:
        # parsing decodes the URI's escapes once before SQLite does, and a file named runs%41.db was read as runsA.db.
        query = {"mode": "ro", "immutable": "1", "uri": "true"}
        engine = create_engine(URL.create("sqlite", database=sqlite_uri(database.resolve()), query=query))
        if not lacks_columns(engine):
            return cls(engine)
        # An older version's store, which cannot get its new columns here: read from a copy that can.
        engine.dispose()
        folder = Path(tempfile.mkdtemp(prefix="overnight-store-"))
        atexit.register(shutil.rmtree, folder, True)
        copy = folder / database.name
        shutil.copyfile(database, copy)
        return cls.open(sqlite_url(copy))


def _database_clock_offset(engine: Engine, url: str) -> timedelta:
    """The database's clock minus this host's, to within half a round trip."""
    try:
        before = utc_now()
        with engine.connect() as connection:
            database_now = connection.execute(select(func.now())).scalar_one()
        after = utc_now()
    except SQLAlchemyError as exc:
        engine.dispose()
        raise StateError(f"cannot open run store {safe_url(url)}: {database_complaint(exc)}") from exc
    if database_now.tzinfo is None:
        database_now = database_now.replace(tzinfo=timezone.utc)
    return database_now - (before + (after - before) / 2)
