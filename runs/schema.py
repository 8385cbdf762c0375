"""The run store's tables: created where missing, and brought up to what this version maps.

A store an older version made lacks the columns and indexes added since: the columns are added with
ALTER TABLE and the indexes created when it is opened (no migration tool for so few), each change in
a transaction of its own that on PostgreSQL gives up, rather than wait without end, when another
session holds the table. A table of the store's names that is not overnight's (it lacks a column
every version made it with) is refused, never altered. Processes opening a new shared store at once
race to create it; a few looks settle it (`create_schema`).
"""

from __future__ import annotations

import contextlib
import random
import time
from typing import Any, Iterator

from sqlalchemy import Connection, Engine, inspect
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, ProgrammingError, SQLAlchemyError
from sqlalchemy.schema import CreateIndex

from orchestrator.errors import StateError
from runs.engine import database_complaint
from runs.models import Base

_SCHEMA_ATTEMPTS = 8


def create_schema(engine: Engine, *, reading: bool = False) -> tuple[Any, ...]:
    """The tables, and columns and indexes added since a store was made; safe with another process doing the same.
    `reading` (a report's open): a column the store's role may not add (a read-only role, a standby's) is left out,
    with a warning; the columns left out are returned, and read as null (RunStore.open).

    Processes opening a new shared store at once each see tables missing, and all but one
    CREATE (or ALTER) fails on "already exists" (PostgreSQL: a duplicate key in its own
    catalog, an IntegrityError, when the other's CREATE commits while this one waits): a new
    look finds more of it there, so a few looks end it.
    """
    # A server that does not answer fails once, after its connect timeout: the attempts below are for the race
    # above, and each would wait that timeout again (a stuck host held a night's start 9 times 20 s).
    with engine.connect():
        pass
    _refuse_foreign_tables(engine)
    for attempt in range(_SCHEMA_ATTEMPTS):
        try:
            Base.metadata.create_all(engine)
            left_out = _add_missing_columns(engine, reading=reading)
            _add_missing_indexes(engine)
            return left_out
        except (OperationalError, ProgrammingError, IntegrityError):
            if attempt == _SCHEMA_ATTEMPTS - 1:
                raise
            time.sleep(random.uniform(0.01, 0.05))


def _refuse_foreign_tables(engine: Engine) -> None:
    """StateError when a table of the store's names is there without a column every version of overnight
    made it with (the ones that may not be empty; later columns all may): some other program's table
    (a `runs` of its own), which overnight must not add its columns to, nor read as its own."""
    try:
        missing = _missing_columns(engine)
    except SQLAlchemyError:
        return  # what the create then meets says what is wrong
    for table, column in missing:
        if not column.nullable:
            raise StateError(
                f"the run store's database holds a table {table.name!r} that is not overnight's (no column {column.name!r}): "
                "point [store] url at a database of overnight's own"
            )


def _missing_columns(engine: Engine) -> list[tuple[Any, Any]]:
    """(table, column) this version maps that the store's existing tables lack (an older version made them)."""
    inspector = inspect(engine)
    missing = []
    for table in _tables_made(inspector):
        present = {column["name"] for column in inspector.get_columns(table.name)}
        missing += [(table, column) for column in table.columns if column.name not in present]
    return missing


def _tables_made(inspector: Any) -> list[Any]:
    """The tables this version maps that the store already has."""
    return [table for table in Base.metadata.sorted_tables if inspector.has_table(table.name)]


def lacks_columns(engine: Engine) -> bool:
    """Whether the store was made by an older version (a column of this one's is missing)."""
    try:
        return bool(_missing_columns(engine))
    except SQLAlchemyError:
        return False  # what the read then meets says what is wrong


def _add_missing_columns(engine: Engine, *, reading: bool) -> tuple[Any, ...]:
    """Nullable columns a newer overnight added to a table an older one made (no migration tool for one column).
    When `reading`, those the role may not add are left out (returned): a report as a read-only role read an older
    version's store before this version added a column, and must still (a night needs them: its open fails)."""
    left_out = []
    for table, column in _missing_columns(engine):
        if column.nullable:
            kind = column.type.compile(dialect=engine.dialect)
            try:
                with _migrating(engine, f"adding the column {column.name} to the table {table.name}") as connection:
                    connection.exec_driver_sql(f'ALTER TABLE {table.name} ADD COLUMN "{column.name}" {kind}')
            except DBAPIError as exc:
                if not reading or getattr(exc.orig, "sqlstate", None) not in _NOT_ALLOWED:
                    raise
                from orchestrator.logs import get_logger

                get_logger().warning("store_column_not_added", column=column.name, table=table.name, error=database_complaint(exc))
                left_out.append(column)
    return tuple(left_out)


def _missing_indexes(engine: Engine) -> list[Any]:
    """The indexes this version maps that the store's existing tables lack (an older version made them: create_all
    makes a table's indexes only with the table)."""
    inspector = inspect(engine)
    missing = []
    for table in _tables_made(inspector):
        present = {index["name"] for index in inspector.get_indexes(table.name)}
        missing += [index for index in table.indexes if index.name not in present]
    return missing


def _add_missing_indexes(engine: Engine) -> None:
    """Indexes a newer overnight added to a table an older one made. IF NOT EXISTS: another process opening the store
    at once may have made it since it was found missing. Only those found missing are created: on PostgreSQL even
    CREATE INDEX IF NOT EXISTS locks the table against writes first. The index is only for speed: one the store's role
    may not create, or that would wait longer than INDEX_LOCK_TIMEOUT_S for another session's open transaction on the
    table, is left out (`store_index_not_added`, a warning) and asked for again at the next open."""
    for index in _missing_indexes(engine):
        what = f"adding the index {index.name} to the table {index.table.name}"
        try:
            with _migrating(engine, what, wait_s=INDEX_LOCK_TIMEOUT_S) as connection:
                connection.execute(CreateIndex(index, if_not_exists=True))
        except (DBAPIError, TableBusy) as exc:
            # A role that may use the tables but not index them (another role owns them on a shared server;
            # a read-only one, a standby's, for `report`) opened an older store before the index; or a session
            # (psql, a report tool) sits in a transaction that wrote to the table: the store opens without it.
            if isinstance(exc, DBAPIError) and getattr(exc.orig, "sqlstate", None) not in _NOT_ALLOWED:
                raise
            from orchestrator.logs import get_logger

            get_logger().warning("store_index_not_added", index=index.name, table=index.table.name, error=database_complaint(exc))


# insufficient_privilege (not the table's owner), read_only_sql_transaction (a read-only role, a standby).
_NOT_ALLOWED = {"42501", "25006"}


@contextlib.contextmanager
def _migrating(engine: Engine, what: str, *, wait_s: float | None = None) -> Iterator[Connection]:
    """A transaction for one change of an existing table (`what` names it); on PostgreSQL, given up with TableBusy
    when another session's open transaction holds the table for longer than `wait_s` (MIGRATION_LOCK_TIMEOUT_S)."""
    wait_s = MIGRATION_LOCK_TIMEOUT_S if wait_s is None else wait_s
    with engine.begin() as connection:
        if engine.dialect.name == "postgresql":
            # ALTER waits for every open transaction on the table (CREATE INDEX for every one that wrote to it):
            # a psql session left in one, a report tool; and every machine's next statement then waits behind
            # it: a night would hang, deaf to signals. Given up instead; the open fails in one line (exit 4).
            connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{int(wait_s * 1000)}ms'")
        try:
            yield connection
        except OperationalError as exc:
            # 55P03 lock_not_available, in whatever language the server speaks.
            if getattr(exc.orig, "sqlstate", None) == "55P03":
                raise TableBusy(
                    f"{what} waited {wait_s:g} s for another session's open transaction on it; "
                    "end that session (psql, a report tool), then run again"
                ) from None
            raise


# How long adding a column may wait for the table on PostgreSQL; an index, only for speed, less: while it
# waits, every other machine's writes to the table wait behind it.
MIGRATION_LOCK_TIMEOUT_S = 20.0
INDEX_LOCK_TIMEOUT_S = 2.0


class TableBusy(Exception):
    """A column or an index could not be added: another session held the table (its message says what to do)."""
