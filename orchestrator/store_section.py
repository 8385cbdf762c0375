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
            # Each thread and each later command would see its own empty database.
            raise ValueError("an in-memory database would not outlive the night; name a file or a server")
        _check_driver_arguments(value, url)
        return value


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
