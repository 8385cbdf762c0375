"""The user's cache folder, where overnight keeps what outlives one process: the embedded model's files, and the
agent's fences where /tmp is mounted noexec."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_folders(name: str) -> list[Path]:
    """`<XDG cache or ~/.cache>/<name>`, or none when there is no home to find: HOME unset and no
    passwd entry, as in a container run under an arbitrary uid (Path.home() raises then)."""
    if os.environ.get("XDG_CACHE_HOME"):
        return [Path(os.environ["XDG_CACHE_HOME"]) / name]
    try:
        return [Path.home() / ".cache" / name]
    except (RuntimeError, KeyError):
        return []
