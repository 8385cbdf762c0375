"""`[store]`: the run store's database, a SQLAlchemy URL checked for what would fail or be lost only once it opens."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from orchestrator.config_section import Section
from orchestrator.url_secrets import shown_url


class StoreConfig(Section):
    url: str | None = Field(None, description="SQLAlchemy URL; default sqlite under state.dir")

    @field_validator("url")
    @classmethod
    def _lasting_database(cls, value: str | None) -> str | None:
        if value is None:
            return value
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            url = make_url(value)
        except ArgumentError:
            raise ValueError(f"{shown_url(value)!r} is not a SQLAlchemy URL (e.g. postgresql+psycopg://user@host/overnight)") from None
        if url.get_backend_name() not in ("sqlite", "postgresql"):
            raise ValueError(f"{url.get_backend_name()!r} is not a database overnight can use: sqlite or postgresql")
        if url.get_backend_name() == "sqlite" and ((url.database or ":memory:") == ":memory:" or url.query.get("mode") == "memory"):
            raise ValueError(_IN_MEMORY)
        _check_driver_arguments(value, url)
        if url.get_backend_name() == "sqlite":
            _check_sqlite_uri(value, url)
        return value


# Each thread and each later command would see its own empty database.
_IN_MEMORY = "an in-memory database would not outlive the night; name a file or a server"


def _check_sqlite_uri(value: str, url: Any) -> None:
    """ValueError for a SQLite `file:` URI whose database is not one file every connection shares with waits: in memory
    however written (`file::memory:`, `mode=memory` inside the database part), or in SQLite's shared cache."""
    from runs.engine import sqlite_uri_read

    read = sqlite_uri_read(url)
    if read is None:
        return
    path, parameters = read
    # `file:` alone (or `file://localhost`): a temporary file, gone at close; `vfs=memdb`: SQLite's in-memory files.
    if path in ("", ":memory:") or parameters.get("mode") == "memory" or parameters.get("vfs") == "memdb":
        raise ValueError(_IN_MEMORY)
    if parameters.get("cache") == "shared":
        # Connections in one shared cache lock tables among themselves and never wait (SQLITE_LOCKED, not BUSY): at
        # concurrency above 1 a night's writes failed with "database table is locked" whatever the busy timeout.
        raise ValueError(
            f"{shown_url(value)!r}: cache=shared makes SQLite fail a write another connection holds a table for "
            '("database table is locked") instead of waiting for it; drop cache=shared'
        )


def _check_driver_arguments(value: str, url: Any) -> None:
    """ValueError for query arguments the driver cannot take (`?timeout=abc`) or would ignore
    (`?mode=ro` without `uri=true`): a traceback when the store opens, or SQLAlchemy's warning on stderr."""
    import warnings

    from sqlalchemy.exc import SAWarning

    try:
        dialect = url.get_dialect()()
    except Exception:  # a driver SQLAlchemy does not know or cannot load: said (exit 4) when the store opens
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", SAWarning)
            dialect.create_connect_args(url)
    except SAWarning as exc:
        raise ValueError(f"{shown_url(value)!r}: {str(exc).split(' (Background on')[0]}") from None
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{shown_url(value)!r}: a query argument the driver cannot take: {exc}") from None
