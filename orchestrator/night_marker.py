"""`<state_dir>/serve-night-started`: the night `serve` started, known before it has recorded its run.

Written by serve just before it starts a night's child, removed once it has seen the child end: a
night that died with serve before the child recorded its run (power lost in its first seconds,
while it imports, loads the model or waits for the state lock) is known by it, as no run shows it.
"""

from __future__ import annotations

import contextlib
import json
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.config import Config
from orchestrator.schedule_events import first_line, logger
from orchestrator.state_files import SERVE_NIGHT_MARKER

STARTED_MARKER_NAME = SERVE_NIGHT_MARKER


def started_marker(config: Config | None) -> Path | None:
    """Where the marker goes; None without a state dir (serve has made it, for its lock: a night started
    otherwise makes its own) or a config that cannot be read."""
    if config is None or not config.state_dir.is_dir():
        return None
    return config.state_dir / STARTED_MARKER_NAME


def mark_started(marker: Path | None, *, pid: int) -> bool:
    """Whether the marker is written."""
    from orchestrator.files import replace_file

    if marker is None:
        return False
    record = {"at": datetime.now(timezone.utc).isoformat(), "pid": pid}
    try:
        replace_file(marker, (json.dumps(record) + "\n").encode())
    except OSError as exc:  # the night runs all the same; only a crash in its first seconds would go unseen
        logger().warning("scheduled_night_not_marked", path=str(marker), error=first_line(exc))
        return False
    return True


def unmark_started(marker: Path | None) -> None:
    if marker is not None:
        with contextlib.suppress(OSError):
            marker.unlink(missing_ok=True)


def marked_start(state_dir: Path) -> tuple[datetime, int] | None:
    """When the marker left in `state_dir` was written, and the pid of its night's child (0 before it began);
    None without a marker, or with one that cannot be read."""
    from orchestrator.files import read_regular_file

    try:
        record = json.loads(read_regular_file(state_dir / STARTED_MARKER_NAME).decode("utf-8"))
        return datetime.fromisoformat(record["at"]), int(record["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
