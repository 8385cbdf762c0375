"""The anchors' stuck-detection policies, as guards, so the benchmark can replay them.

Each sees calls as the model wrote them (name and raw JSON arguments, broken
ones too) and knows nothing of results, except ttalk's notion of a write.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Sequence

from orchestrator.errors import QualityError
from orchestrator.protocols import GuardContext
from orchestrator.records import BrokenCall, Level, ModelResponse, ToolCall, ToolResult


class IdenticalCallStop:
    """Stop when the same call (name + exact arguments JSON) comes `stop_at` times in a row."""

    def __init__(self, kind: str, stop_at: int) -> None:
        self.kind = kind
        self.stop_at = stop_at
        self._previous: str | None = None
        self._count = 0

    def before_run(self, ctx: GuardContext) -> None:
        self._previous, self._count = None, 0

    def after_model_response(
        self, ctx: GuardContext, response: ModelResponse, calls: Sequence[ToolCall | BrokenCall]
    ) -> None:
        for raw in response.tool_calls:
            key = f"{raw.name} {raw.arguments}"
            self._count = self._count + 1 if key == self._previous else 1
            self._previous = key
            if self._count >= self.stop_at:
                raise QualityError(self.kind, "stop", message=f"{raw.name} ×{self._count}")


def robotlab_quality_monitor() -> list[object]:
    """RobotLab QualityMonitor: stop at the 4th identical consecutive call, whatever it returned."""
    return [IdenticalCallStop("robotlab", 4)]


def mini_me() -> list[object]:
    """mini-me: stop after 6 identical consecutive calls."""
    return [IdenticalCallStop("mini-me", 6)]


class TtalkDeadLoop:
    """ttalk dead-loop filter: remind when the last 4 of 6 rounds have at most 2 fingerprints.

    Progress is only a successful write; the fingerprint is exact (sorted JSON).
    """

    kind = "ttalk"

    def __init__(self, window: int = 6, recent: int = 4, distinct: int = 2) -> None:
        self.recent, self.distinct = recent, distinct
        self._rounds: deque[str] = deque(maxlen=window)
        self._pending: list[str] = []
        self._expected = 0
        self._wrote = False

    def before_run(self, ctx: GuardContext) -> None:
        self._rounds.clear()

    def after_model_response(
        self, ctx: GuardContext, response: ModelResponse, calls: Sequence[ToolCall | BrokenCall]
    ) -> None:
        self._expected = sum(1 for c in calls if isinstance(c, ToolCall))
        self._pending, self._wrote = [], False

    def after_tool_call(self, ctx: GuardContext, call: ToolCall, result: ToolResult) -> None:
        self._pending.append(f"{call.name}:{json.dumps(call.arguments, sort_keys=True)}"[:100])
        self._wrote = self._wrote or (result.ok and call.name in ("write_file", "edit_file"))
        if len(self._pending) < self._expected:
            return
        if self._wrote:
            self._rounds.clear()
            return
        self._rounds.append("\n".join(sorted(self._pending)))
        recent = list(self._rounds)[-self.recent :]
        if len(recent) == self.recent and len(set(recent)) <= self.distinct:
            self._rounds.clear()
            ctx.report(Level.WARNING, self.kind, "reminder")


def ttalk() -> list[object]:
    return [TtalkDeadLoop()]


BASELINES = {"RobotLab": robotlab_quality_monitor, "mini-me": mini_me, "ttalk": ttalk}
