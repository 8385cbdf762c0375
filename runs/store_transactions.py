"""How the run store writes and reads: each change in a short transaction of its own, after the queued events.

RunStore's parts (run_writes.py, lease_rows.py, recovery_rows.py, run_reads.py, store_upkeep.py) each say their
rows through this: `_writing` (an ORM session) and `_statements` (a plain connection, for the single statements
written when N tasks start at once), both committed on exit; `_reading`, one snapshot; `_add` and `_update` of one row; and
`_add_event`, which queues an event for runs/event_writer.py. On SQLite this process's writers take turns on a
lock of the store's own. The times written are the store's clock: this host's, or in a PostgreSQL store the
database's (`now`).
"""

from __future__ import annotations

import contextlib
import threading
from datetime import datetime, timedelta
from typing import Any, Iterator

from sqlalchemy import Connection, Engine, event, insert, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import ORMExecuteState, Session, defer, sessionmaker

from orchestrator.errors import StateError
from runs.engine import database_complaint
from runs.event_batches import EventBatches
from runs.event_writer import EventWriter
from runs.models import Base, utc_now


class StoreTransactions:
    """The store's engine, its event queue and its clock, and the transactions its parts write and read in."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        # SQLite takes one writer at a time, and its busy handler retries after sleeping
        # 1, 2, 5, 10, 15... ms: N tasks starting or ending together would wait tens of
        # milliseconds for a write of a fraction of one. This process's threads queue here
        # instead and are woken the moment the write before theirs commits; another
        # process (rare: the state dir's lock keeps out a second night) still meets busy_timeout.
        self._one_writer: Any = threading.Lock() if engine.dialect.name == "sqlite" else contextlib.nullcontext()
        self._event_batches = EventBatches(engine)
        self._events = EventWriter(self._event_batches.write, database_complaint, write_lock=self._one_writer)
        # The last run this object began: the night of this process, whatever others share the store.
        self.begun_run_id: int | None = None
        # Leases go by one clock. Machines sharing a PostgreSQL store each keep their own, which
        # may be off by more than a ttl: there, "now" is the database's (now(), its transaction's
        # start), so no host takes a live lease by its clock or writes one already expired.
        # A SQLite file is one host's: that host's clock.
        self._database_clock = engine.dialect.name == "postgresql"
        # How far the database's clock is ahead of this host's (measured at `open`): the times this
        # store writes are the database's there too, so that one machine's "finished after that night
        # began" (`succeeded_elsewhere`) is judged by one clock, not two that may disagree.
        self._clock_offset = timedelta(0)

    def read_without(self, columns: tuple[Any, ...]) -> None:
        """Read the rows without `columns` (an older version's store that a read-only role could not add them to):
        left unloaded, which runs/views_from_rows.py reads as null."""
        if not columns:
            return
        mapped = {mapper.local_table: mapper.class_ for mapper in Base.registry.mappers}
        attributes = [getattr(mapped[column.table], column.key) for column in columns]

        def leave_out(state: ORMExecuteState) -> None:
            if state.is_select:
                classes = {mapper.class_ for mapper in state.all_mappers}
                state.statement = state.statement.options(
                    *(defer(attribute, raiseload=True) for attribute in attributes if attribute.class_ in classes)
                )

        event.listen(self._sessions, "do_orm_execute", leave_out)

    def now(self) -> datetime:
        """The time this store writes: this host's clock, or in a PostgreSQL store the database's."""
        return utc_now() + self._clock_offset

    def on_this_hosts_clock(self, moment: datetime) -> datetime:
        """A time this store wrote, read on this host's clock (to compare with a process's start)."""
        return moment - self._clock_offset

    def close(self) -> None:
        self._events.close()
        self._event_batches.close()
        self._engine.dispose()

    def flush(self) -> None:
        """Wait until the queued events are written (reads and the writes that must follow them do this first)."""
        self._events.flush()

    @contextlib.contextmanager
    def _writing(self, action: str) -> Iterator[Session]:
        """One short transaction, committed on exit; database failures become StateError."""
        self._events.flush()
        try:
            with self._one_writer, self._sessions.begin() as session:
                yield session
        except SQLAlchemyError as exc:
            raise StateError(f"run store: {action} failed: {database_complaint(exc)}") from exc

    @contextlib.contextmanager
    def _statements(
        self, action: str, *, expected: tuple[type[SQLAlchemyError], ...] = (), after_events: bool = True
    ) -> Iterator[Connection]:
        """Like `_writing`, on a plain connection: the per-task writes are single statements,
        and the ORM's unit of work would double their cost when N tasks start at once.
        Errors in `expected` are an answer, not a failure: they reach the caller as they are.

        `after_events=False` for a write that needs no queued event before it (a task or an
        iteration begun, a task ended after its iterations, a lease): waiting for the queue
        would wait for the other tasks' events, and hurry their batch, for nothing.
        """
        if after_events:
            self._events.flush()
        try:
            with self._one_writer, self._engine.begin() as connection:
                yield connection
        except expected:
            raise
        except SQLAlchemyError as exc:
            raise StateError(f"run store: {action} failed: {database_complaint(exc)}") from exc

    @contextlib.contextmanager
    def _reading(self) -> Iterator[Session]:
        """One read transaction: all its statements see the store as it was at one moment, so a report read while a
        night commits never shows a run, its tasks, iterations and events each as of a different write."""
        self._events.flush()
        try:
            with self._engine.connect() as connection, self._sessions(bind=self._snapshot(connection)) as session:
                yield session
        except SQLAlchemyError as exc:
            raise StateError(f"run store: reading failed: {database_complaint(exc)}") from exc

    def _snapshot(self, connection: Connection) -> Connection:
        """`connection`, its transaction begun as one snapshot. Each database's default reads each statement anew:
        pysqlite begins a transaction only before a write (every SELECT alone, as SQLAlchemy's docs on its
        isolation say), so a BEGIN of our own holds the WAL snapshot its first read takes; PostgreSQL's READ
        COMMITTED takes a snapshot per statement, REPEATABLE READ one per transaction. Ended by a rollback as the
        connection goes back to the pool; the writes (`_writing`, `_statements`) go on as they were."""
        if self._engine.dialect.name == "sqlite":
            connection.exec_driver_sql("BEGIN")
        elif self._engine.dialect.name == "postgresql":
            connection.execution_options(isolation_level="REPEATABLE READ")
        return connection

    def _add(self, action: str, model: type[Base], *, after_events: bool = True, **values: Any) -> int:
        with self._statements(action, after_events=after_events) as connection:
            return connection.execute(insert(model.__table__), values).inserted_primary_key[0]

    def _update(self, action: str, model: type[Base], row_id: int, *, after_events: bool = True, **values: Any) -> None:
        table = model.__table__
        with self._statements(action, after_events=after_events) as connection:
            result = connection.execute(update(table).where(table.c.id == row_id).values(**values))
            if result.rowcount == 0:
                raise LookupError(f"run store: {action}: no {table.name} row with id {row_id}")

    def _add_event(self, values: dict[str, Any], *, heartbeat: bool = False) -> None:
        """Queue one event (and, if asked, a beat of the iteration's heartbeat): see runs/event_writer.py."""
        if self._clock_offset:
            values["at"] += self._clock_offset
        self._events.put(values, beat=heartbeat)
