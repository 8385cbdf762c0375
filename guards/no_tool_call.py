"""Stop a model that keeps talking instead of acting, and warn one that fires many calls at once.

Both are what real small models do (seen with Gemma 3 270M): pages of prose that
imitate tool results without calling anything, or a dozen calls in one answer
with the last one cut off. The loop already nudges after prose; this guard
ends the iteration when nudges do not help, instead of burning every turn.
"""

from __future__ import annotations

from typing import Sequence

from orchestrator.errors import QualityError
from orchestrator.protocols import GuardContext
from orchestrator.records import BrokenCall, Level, ModelResponse, ToolCall

from guards._describe import times

KIND = "no_tool_call"
CORRECTION = (
    "Do not describe what you would do or imagine tool results: call a tool. Every answer must "
    "contain exactly one tool call, for example read_file or list_dir to look, edit_file to change code."
)
MANY_CALLS = "many_calls"
ONE_AT_A_TIME = "Make one tool call per answer, then wait for its result before deciding the next."


class NoToolCallGuard:
    """Answers in a row with text but no call: stop at `stop_at`. Many calls in one answer: warn."""

    def __init__(self, stop_at: int = 3, many_calls_at: int = 4) -> None:
        self.stop_at = stop_at
        self.many_calls_at = many_calls_at
        self._count = 0

    def before_run(self, ctx: GuardContext) -> None:
        self._count = 0

    def after_model_response(
        self, ctx: GuardContext, response: ModelResponse, calls: Sequence[ToolCall | BrokenCall]
    ) -> None:
        if len(calls) >= self.many_calls_at:
            ctx.remind(ONE_AT_A_TIME)
            ctx.report(Level.WARNING, MANY_CALLS, f"{len(calls)} calls in one answer")
        if calls or response.tool_calls or not response.text.strip():
            self._count = 0  # an empty answer is the empty-response guard's business
            return
        self._count += 1
        if self._count >= self.stop_at:
            evidence = f"{self._count} answers in a row without a tool call; the last began: {response.text.strip()[:160]!r}"
            raise QualityError(KIND, CORRECTION, evidence=evidence, message=f"no tool call{times(self._count)}")
