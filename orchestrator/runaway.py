"""The runaway cut-off: an answer that grows past `max_output_chars`, or loops, ends as `QualityError("runaway_output")`.

A small model left alone can write one unit over and over until the window fills, each
time at the night's cost. The cut-off is here and nowhere else: what counts as a loop
(and the wider window a file being written is allowed), the cap, and the correction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.errors import QualityError

if TYPE_CHECKING:
    from orchestrator.response_draft import Draft

# Runaway repetition: the last REPEAT_WINDOW characters are one unit of at most
# REPEAT_MAX_UNIT characters over and over. Checked every REPEAT_CHECK_EVERY
# new characters so a long stream costs little.
REPEAT_WINDOW = 512
# A file being written may repeat a short unit for a while (an empty board in a test fixture, a
# table of zeros, a rule line): in a call's arguments, and in text once a written call has begun
# in it, a loop must fill this much (max_output_chars still caps the whole).
WRITTEN_REPEAT_WINDOW = 4096
# What begins a call written in the text (orchestrator/written_calls.py reads these forms).
_WRITTEN_CALL_OPENINGS = ("<tool_call>", "<function=", "[TOOL_CALLS]", '"arguments"', '"parameters"', "[ARGS]")
_LONGEST_OPENING = max(map(len, _WRITTEN_CALL_OPENINGS))
REPEAT_MAX_UNIT = 64
REPEAT_CHECK_EVERY = 32

RUNAWAY_CORRECTION = (
    "The reply ran away (far too long, or repeating itself). Keep replies short, "
    "make one tool call at a time, and stop once the call is written."
)


def runaway_output(evidence: str) -> QualityError:
    return QualityError("runaway_output", RUNAWAY_CORRECTION, evidence=evidence)


@dataclass
class RepeatTail:
    """The recent tail of one growing text (content, reasoning or a call's arguments), watched for a loop."""

    tail: str = ""
    unchecked: int = 0
    # How much of one unit over and over is a loop: WRITTEN_REPEAT_WINDOW for a call's arguments.
    window: int = REPEAT_WINDOW
    # Text, which may come to hold a written call: its window widens once one begins.
    may_hold_calls: bool = False

    def add(self, piece: str) -> None:
        if self.may_hold_calls:
            new = self.tail[-_LONGEST_OPENING:] + piece  # an opening may have begun in the piece before
            if any(opening in new for opening in _WRITTEN_CALL_OPENINGS):
                self.may_hold_calls, self.window = False, WRITTEN_REPEAT_WINDOW
        self.tail = (self.tail + piece)[-self.window :]
        self.unchecked += len(piece)

    def looping_unit(self) -> tuple[str, int] | None:
        """The unit the tail repeats, and the window, if the whole window is one unit over and over."""
        if self.unchecked < REPEAT_CHECK_EVERY or len(self.tail) < self.window:
            return None
        self.unchecked = 0
        tail = self.tail
        for unit in range(1, REPEAT_MAX_UNIT + 1):
            if tail[unit:] == tail[:-unit]:
                return tail[:unit], self.window
        return None


def check_runaway(draft: Draft, max_output_chars: int) -> None:
    """Raise runaway_output if the answer being put together has passed the cap, or loops."""
    if draft.written_chars() > max_output_chars:
        raise runaway_output(f"output passed {max_output_chars} chars")
    loop = draft.looping_unit()
    if loop is not None:
        unit, window = loop
        raise runaway_output(f"output repeats {unit[:40]!r} over its last {window} chars")
