"""What a person watching a terminal sees: one coloured line per struggle signal.

Guards never print; they report signals, and this is one of the places a
signal goes. Colour only on a terminal, and never when NO_COLOR is set.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from orchestrator.logs import lossy
from orchestrator.records import Level, Signal

_YELLOW, _RED, _RESET = "\033[33m", "\033[31m", "\033[0m"
_MARKS = {Level.WARNING: ("⚠", _YELLOW), Level.SEVERE: ("✖", _RED)}


def use_colour(stream: TextIO) -> bool:
    return "NO_COLOR" not in os.environ and hasattr(stream, "isatty") and stream.isatty()


class SignalPrinter:
    """A SignalSink that prints `⚠ loop: read_file ×3` lines, tagged with the task."""

    def __init__(self, stream: TextIO | None = None, task: str = "") -> None:
        # None when stderr was closed before the start (`2>&-`): the lines go nowhere then, as the
        # log's do, never onto stdout (print's fallback), which a script may be reading.
        self.stream = stream if stream is not None else sys.stderr
        self.task = task
        self.colour = use_colour(self.stream)

    def for_task(self, task: str) -> "SignalPrinter":
        return SignalPrinter(self.stream, task)

    def __call__(self, signal: Signal) -> None:
        mark, colour = _MARKS[signal.level]
        where = f"[{self.task}] " if self.task else ""
        line = f"{mark} {where}{signal.kind}: {signal.message}"
        if self.colour:
            line = f"{colour}{line}{_RESET}"
        # Lossy, as the log is: a reader gone away (`2>&1 | head`) loses lines, not the night.
        print(line, file=lossy(self.stream), flush=True)
