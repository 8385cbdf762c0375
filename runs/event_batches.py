"""One batch of events rows, and the heartbeats they carry, written in one transaction.

The event writer (runs/event_writer.py) calls this once per batch from its own
thread. On SQLite it goes through one DBAPI connection of the engine's own pool
(its pragmas applied as for every connection) with the two statements compiled
once, and each value converted by the column type's own bind processor, so the
rows are stored exactly as SQLAlchemy stores them. The reason is CPU: with a
night at concurrency 1, a batch is written every model call, after the thread
has slept; a cold SQLAlchemy Core `execute` of the same rows cost 1.2-1.3 ms of
CPU there against ~0.55 ms this way (2-vCPU build VM, 50 ms between batches),
about a fifth of the night's CPU per model call. Other databases (PostgreSQL)
take the plain Core path: their writes wait on the network anyway.
"""

from __future__ import annotations

from typing import Any, Callable

from sqlalchemy import Engine, bindparam, insert, update

from runs.models import Event, Iteration

_EVENTS = Event.__table__
_ITERATIONS = Iteration.__table__
# Every column but the id: `event_rows.event_row` gives each of them, so one compiled statement serves every row.
_EVENT_COLUMNS = [column.name for column in _EVENTS.columns if column.name != "id"]
_INSERT_EVENT = insert(_EVENTS)
# Named binds, so one compiled statement serves every beat.
_BEAT = update(_ITERATIONS).where(_ITERATIONS.c.id == bindparam("beat_id")).values(heartbeat_at=bindparam("beat_at"))


class EventBatches:
    """`write(rows, beats)`: events rows (dicts of every column but the id) and the iterations'
    heartbeats ({iteration_id: beat_at}), all or nothing. One thread at a time."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._direct = engine.dialect.name == "sqlite"
        self._connection: Any = None  # the DBAPI connection held for the direct path
        if self._direct:
            dialect = engine.dialect
            insert_compiled = _INSERT_EVENT.compile(dialect=dialect, column_keys=_EVENT_COLUMNS)
            beat_compiled = _BEAT.compile(dialect=dialect)
            # SQLite's paramstyle is positional (qmark): the compiled statements say the order.
            self._insert_sql, self._insert_order = str(insert_compiled), list(insert_compiled.positiontup or ())
            self._beat_sql = str(beat_compiled)
            # SET's bind, then WHERE's: each beat's tuple is built in that order, without a dict per beat.
            if list(beat_compiled.positiontup or ()) != ["beat_at", "beat_id"]:
                raise RuntimeError(f"unexpected bind order in {self._beat_sql!r}: {beat_compiled.positiontup}")
            converters = {column.name: _converter(column.type, dialect) for column in _EVENTS.columns}
            self._insert_converters = [converters[name] for name in self._insert_order]
            self._beat_at = _converter(_ITERATIONS.c.heartbeat_at.type, dialect) or _unchanged
            self._iteration_id = _converter(_ITERATIONS.c.id.type, dialect) or _unchanged

    def write(self, rows: list[dict[str, Any]], beats: dict[int, Any]) -> None:
        if not self._direct:
            with self._engine.begin() as connection:
                connection.execute(_INSERT_EVENT, rows)
                if beats:
                    connection.execute(_BEAT, [{"beat_id": iteration_id, "beat_at": at} for iteration_id, at in beats.items()])
            return
        if self._connection is None:
            self._connection = self._engine.raw_connection()
        connection = self._connection
        try:
            cursor = connection.cursor()
            try:
                cursor.executemany(self._insert_sql, [_values(row, self._insert_order, self._insert_converters) for row in rows])
                if beats:
                    values = [(self._beat_at(at), self._iteration_id(iteration_id)) for iteration_id, at in beats.items()]
                    cursor.executemany(self._beat_sql, values)
            finally:
                cursor.close()
            connection.commit()
        except BaseException:
            self._abandon()
            raise

    def close(self) -> None:
        """Give the held connection back to the engine's pool."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    def _abandon(self) -> None:
        """After a failed batch: its transaction rolled back, and the connection given up (the next
        batch takes a fresh one), whatever state the failure left it in."""
        connection, self._connection = self._connection, None
        try:
            connection.rollback()
        except Exception:  # the rollback's own failure changes nothing: the connection is dropped
            connection.invalidate()
        else:
            connection.close()


def _converter(column_type: Any, dialect: Any) -> Callable[[Any], Any] | None:
    return column_type.dialect_impl(dialect).bind_processor(dialect)


def _unchanged(value: Any) -> Any:
    return value


def _values(row: dict[str, Any], order: list[str], converters: list[Callable[[Any], Any] | None]) -> tuple[Any, ...]:
    return tuple(row[name] if convert is None else convert(row[name]) for name, convert in zip(order, converters))
