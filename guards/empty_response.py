"""Nudge, then stop, a model that answers with nothing at all."""

from __future__ import annotations

from typing import Sequence

from orchestrator.errors import QualityError
from orchestrator.protocols import GuardContext
from orchestrator.records import BrokenCall, Level, ModelResponse, ToolCall

from guards._describe import times

KIND = "empty_response"
NUDGE = (
    "Your last answer was empty. Answer with a tool call. If you are not sure what to do next, "
    "call list_dir or read_file; when the check passes, call submit(summary)."
)
CORRECTION = (
    "Never answer with an empty message. Every answer must call one tool: read_file or list_dir "
    "to look, edit_file or write_file to change code, run_check to test, submit(summary) when done."
)


class EmptyResponseGuard:
    """Counts answers in a row with no text and no calls; any other answer resets."""

    def __init__(self, stop_at: int = 2) -> None:
        self.stop_at = stop_at
        self._count = 0

    def before_run(self, ctx: GuardContext) -> None:
        self._count = 0

    def after_model_response(
        self, ctx: GuardContext, response: ModelResponse, calls: Sequence[ToolCall | BrokenCall]
    ) -> None:
        if calls or response.tool_calls or response.text.strip():
            self._count = 0
            return
        self._count += 1
        message = f"empty response{times(self._count)}"
        if self._count >= self.stop_at:
            evidence = f"{self._count} empty responses in a row (finish_reason={response.finish_reason or 'none'})"
            raise QualityError(KIND, CORRECTION, evidence=evidence, message=message)
        ctx.remind(NUDGE)
        ctx.report(Level.WARNING, KIND, message)
