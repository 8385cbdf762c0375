"""`[store]`: the run store's database, a SQLAlchemy URL checked for what would fail or be lost only once it opens."""

from __future__ import annotations

import re
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
    """ValueError for a SQLite `file:` URI whose database is not one writable file every connection shares with waits:
    in memory however written (`file::memory:`, `mode=memory` inside the database part), in SQLite's shared cache,
    without file locks, or read-only; or one SQLite refuses to open (orchestrator.sqlite_uri_modes: another machine's
    `file://host/`, a `mode`, `cache` or `vfs` it does not know, those three given twice in the query). Each parameter
    read as SQLite reads it (runs.engine.sqlite_uri_read)."""
    from orchestrator.sqlite_uri_modes import sqlite_authority_refusal, sqlite_uri_refusal
    from runs.engine import sqlite_uri_read

    read = sqlite_uri_read(url)
    if read is None:
        return
    path, pairs = read
    shown = shown_url(value)
    repeated = next((name for name in ("mode", "cache", "vfs") if isinstance(url.query.get(name), tuple)), None)
    if repeated:
        # SQLAlchemy joins a name given twice in the query into one value, `mode=('rw', 'ro')`, which SQLite refuses.
        raise ValueError(
            f"{shown!r}: {repeated} is given more than once; SQLAlchemy hands SQLite {repeated}={url.query[repeated]!r}, "
            f"which it cannot read (it failed as it opened, exit 4): give {repeated} once"
        )
    last, first = dict(pairs), dict(reversed(pairs))
    # `file:` alone (or `file://localhost`): a temporary file, gone at close; `vfs=memdb`: SQLite's in-memory files.
    if path in ("", ":memory:") or last.get("mode") == "memory" or last.get("vfs") == "memdb":
        raise ValueError(_IN_MEMORY)
    if last.get("cache") == "shared":
        # Connections in one shared cache lock tables among themselves and never wait (SQLITE_LOCKED, not BUSY): at
        # concurrency above 1 a night's writes failed with "database table is locked" whatever the busy timeout.
        raise ValueError(
            f"{shown!r}: cache=shared makes SQLite fail a write another connection holds a table for "
            '("database table is locked") instead of waiting for it; drop cache=shared'
        )
    unlocked, drop = (f"nolock={first['nolock']}", "nolock") if _sqlite_true(first.get("nolock")) else (None, None)
    if last.get("vfs") == "unix-none":
        unlocked, drop = "vfs=unix-none", "vfs=unix-none"
    if unlocked:
        # Two writers at once (a night's tasks at [night] concurrency above 1, `serve` and `run` together) would each
        # write pages the other does not know of: a corrupt store, not a wait.
        raise ValueError(
            f"{shown!r}: {unlocked} turns SQLite's file locks off, so writers at once (the tasks of a night at "
            f"[night] concurrency above 1, serve and run together) may corrupt the store; drop {drop}"
        )
    # `mode=ro` anywhere: the last is read-only, or a later wider mode is refused ("access mode not allowed").
    read_only = f"immutable={first['immutable']}" if _sqlite_true(first.get("immutable")) else None
    if "ro" in (value for name, value in pairs if name == "mode"):
        read_only = "mode=ro"
    if read_only:
        raise ValueError(
            f"{shown!r}: {read_only} opens the database read-only, but every night writes to it (it failed as it opened, exit 4); "
            f"the store must be writable: drop {read_only}"
        )
    refusal = sqlite_authority_refusal(url.database) or sqlite_uri_refusal(pairs)
    if refusal:
        raise ValueError(f"{shown!r}: {refusal} (it failed as the store opened, exit 4)")


def _sqlite_true(value: str | None) -> bool:
    """Whether SQLite takes a URI parameter's value as true (sqlite3_uri_boolean): one starting with an ASCII digit is
    the 32-bit int SQLite's sqlite3Atoi makes of it (`1x` is 1, `0x1` is hex 1, past 32 bits or 10 digits 0) cut to
    its low byte, true unless 0 (`256` is false, `257` true); else `on`, `yes` or `true` in any case. Anything else
    (`full`, `+1`, empty) is false."""
    if not value:
        return False
    if value[0] in "0123456789":
        return _sqlite_atoi(value) & 0xFF != 0
    return value.lower() in ("on", "yes", "true")


def _sqlite_atoi(value: str) -> int:
    """The int SQLite's sqlite3GetInt32 reads from the start of `value` (which starts with a digit), 0 where it refuses
    the number: hex after `0x` (at most 8 digits, under 2**31), else decimal (at most 10 digits, under 2**31)."""
    hexadecimal = re.match(r"0[xX]([0-9a-fA-F]+)", value)
    if hexadecimal:
        digits = hexadecimal[1].lstrip("0")
        return int(digits or "0", 16) if len(digits) <= 8 and int(digits or "0", 16) < 2**31 else 0
    digits = re.match(r"0*([0-9]*)", value)[1]
    return int(digits or "0") if len(digits) <= 10 and int(digits or "0") < 2**31 else 0


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
