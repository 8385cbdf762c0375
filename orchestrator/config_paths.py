"""Where a config's paths lead: against the config file's folder, `~` as the user's home, and a path that cannot be
resolved said with its key (no traceback); and the name the config file has unless `--config` gives another."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.errors import ConfigError
from orchestrator.state_files import STORE_FILE

if TYPE_CHECKING:
    from orchestrator.config_record import Config

DEFAULT_CONFIG_NAME = "overnight.toml"


def resolved(path: Path, key: str, error: type[Exception] = ConfigError) -> Path:
    """`path` made absolute with its links followed, or `error` naming `key` where it cannot be."""
    try:
        return path.resolve()
    # RuntimeError: a symlink loop (before Python 3.13); ValueError: a NUL, had one got past the load.
    except (OSError, RuntimeError, ValueError) as exc:
        raise error(f"{key}: {path} cannot be resolved: {getattr(exc, 'strerror', None) or exc}") from None


def store_url_of(config: Config) -> str:
    """`Config.store_url`: the config's folder is resolved only where a relative SQLite file needs it."""
    if config.store.url is None:
        from runs.engine import sqlite_url

        return sqlite_url(config.state_dir / STORE_FILE)
    from sqlalchemy.engine import make_url

    from runs.engine import in_uri_form, sqlite_uri, sqlite_uri_path

    url = make_url(config.store.url)
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return config.store.url
    # Against the config's folder, as every path here: not the folder cron happens to start in;
    # `~` is the user's home (SQLite itself would take it for a folder's name).
    if not (url.database.startswith("file:") and in_uri_form(url)):
        return url.set(database=str(config.base_dir / os.path.expanduser(url.database))).render_as_string(hide_password=False)
    path = sqlite_uri_path(url.database)
    if not path or path == ":memory:" or url.query.get("mode") == "memory" or os.path.isabs(path):
        return config.store.url
    # Only the path is replaced: what follows it as written (`?mode=rw`, a `#` fragment), which SQLite reads with the
    # query the driver appends, as the load checks read it. Without the fragment, parameters SQLite took for part of it
    # (`file:runs.db%23x?uri=true&nolock=1`) would reach SQLite unchecked.
    written = url.database.removeprefix("file:")
    tail = written[min((i for i in (written.find("?"), written.find("#")) if i >= 0), default=len(written)):]
    database = sqlite_uri(config.base_dir / os.path.expanduser(path)) + tail
    return url.set(database=database).render_as_string(hide_password=False)
