"""A JSONL transcript per iteration: every message, model call, tool call and signal, in order.

Each line is flushed as it is written, so a crash still leaves the record up to that point.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class Transcript:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        # backslashreplace: a lone surrogate that got this far is written as its JSON escape, not a crash.
        self._handle = path.open("a", encoding="utf-8", errors="backslashreplace")

    def write(self, entry: str, **fields: Any) -> None:
        if self._handle.closed:
            return
        line = json.dumps({"t": round(time.time(), 3), "entry": entry, **fields}, ensure_ascii=False, default=str)
        self._handle.write(line + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> "Transcript":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
