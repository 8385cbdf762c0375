"""Remind a model that circles between a few successful calls without changing anything."""

from __future__ import annotations

import json
from collections import deque
from typing import Callable, Sequence

from orchestrator.protocols import GuardContext
from orchestrator.records import BrokenCall, Level, ModelResponse, ToolCall, ToolResult

KIND = "dead_loop"
REMINDER = (
    "You keep making the same few calls without changing anything. Stop looking at the same things "
    "again: decide on one change, make it with edit_file or write_file, then run the check."
)
_CALL_PRINT_CHARS = 100

Progress = Callable[[Sequence[ToolCall], Sequence[ToolResult]], bool]


class DeadLoopGuard:
    """Fingerprints each round (the calls of one answer) and watches the last few.

    Every call may succeed, so the repeat and failure guards miss this. It only
    reminds: a false stop would cut real work short, a miss costs a few turns.
    """

    def __init__(
        self,
        window: int = 6,
        recent: int = 4,
        distinct: int = 2,
        progress_tools: Sequence[str] = ("write_file", "edit_file"),
        progress: Progress | None = None,
    ) -> None:
        self.recent = recent
        self.distinct = distinct
        self.progress_tools = frozenset(progress_tools)
        self.progress = progress
        self._rounds: deque[str] = deque(maxlen=max(window, recent))
        self._pending = 0
        self._calls: list[ToolCall] = []
        self._results: list[ToolResult] = []

    def before_run(self, ctx: GuardContext) -> None:
        self._rounds.clear()
        self._start_round(0)

    def after_model_response(
        self, ctx: GuardContext, response: ModelResponse, calls: Sequence[ToolCall | BrokenCall]
    ) -> None:
        # Answers without a valid call run nothing; they neither open nor close a round.
        self._start_round(sum(1 for c in calls if isinstance(c, ToolCall)))

    def after_tool_call(self, ctx: GuardContext, call: ToolCall, result: ToolResult) -> None:
        self._calls.append(call)
        self._results.append(result)
        self._pending -= 1
        if self._pending <= 0:
            self._close_round(ctx)

    def _start_round(self, expected: int) -> None:
        self._pending = expected
        self._calls = []
        self._results = []

    def _close_round(self, ctx: GuardContext) -> None:
        calls, results = self._calls, self._results
        self._start_round(0)
        if self._made_progress(calls, results):
            self._rounds.clear()
            return
        self._rounds.append(round_print(calls))
        if len(self._rounds) < self.recent:
            return
        distinct = len(set(list(self._rounds)[-self.recent :]))
        if distinct > self.distinct:
            return
        self._rounds.clear()
        ctx.remind(REMINDER)
        ctx.report(Level.WARNING, KIND, f"dead loop: {distinct} calls over {self.recent} rounds")

    def _made_progress(self, calls: Sequence[ToolCall], results: Sequence[ToolResult]) -> bool:
        if self.progress is not None:
            return bool(self.progress(calls, results))
        return any(r.ok and c.name in self.progress_tools for c, r in zip(calls, results))


def round_print(calls: Sequence[ToolCall]) -> str:
    """Each call as `name:` + normalised arguments cut to 100 chars, sorted, joined."""
    prints = sorted(_call_print(c) for c in calls)
    return "\n".join(prints)


def _call_print(call: ToolCall) -> str:
    arguments = " ".join(json.dumps(call.arguments, sort_keys=True, ensure_ascii=False).split())
    return f"{call.name}:{arguments}"[:_CALL_PRINT_CHARS]
