"""INSERT ... ON CONFLICT DO UPDATE, where the database has it: one atomic statement for a lease taken.

Where it has none (another kind of database, or too old a version), RunStore.acquire_lease tries an INSERT,
then a conditional UPDATE.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.dialects import postgresql, sqlite

# INSERT ... ON CONFLICT DO UPDATE, where the database has it: from these versions on.
_UPSERTS = {"sqlite": (sqlite.insert, (3, 24)), "postgresql": (postgresql.insert, (9, 5))}


def upsert_of(dialect: Any) -> Any:
    """This database's INSERT with ON CONFLICT, or None: another kind, or too old a version."""
    upsert, since = _UPSERTS.get(dialect.name, (None, ()))
    if dialect.name == "sqlite":
        version = tuple(dialect.dbapi.sqlite_version_info) if dialect.dbapi else ()
    else:
        version = tuple(dialect.server_version_info or ())
    return upsert if upsert is not None and version >= since else None
