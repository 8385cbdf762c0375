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
    "call list_dir or read_file; when the check passes, call submit with a one-line summary."
)
CUT_OFF_NUDGE = (
    "Your last answer was cut off at the token limit while you were still thinking, before any tool call. "
    "Think briefly, then answer with one tool call."
)
CUT_OFF_CORRECTION = (
    "Last time your answers were cut off at the token limit while you were still thinking, before any tool call. "
    "Think briefly and answer with one tool call. (For the person: raise [model] max_tokens, or turn the "
    "model's thinking off.)"
)
CORRECTION = (
    "Never answer with an empty message. Every answer must call one tool: read_file or list_dir "
    "to look, edit_file or write_file to change code, run_check to test, submit when done."
)


class EmptyResponseGuard:
    """Counts answers in a row with no text and no calls; any other answer resets.

    A reasoning model cut off at the token limit (finish_reason "length") with
    reasoning but nothing else did not choose to answer empty: its nudge and
    correction say so, and point the person at `[model] max_tokens`.
    """

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
        cut_off = response.finish_reason == "length" and bool(response.reasoning.strip())
        message = f"empty response{' (cut off while thinking)' if cut_off else ''}{times(self._count)}"
        if self._count >= self.stop_at:
            if cut_off:
                evidence = (
                    f"{self._count} empty responses in a row; the last was cut off at the token limit "
                    f"(finish_reason=length, {response.completion_tokens} completion tokens) after "
                    f"{len(response.reasoning)} characters of reasoning, with no text or call"
                )
                raise QualityError(KIND, CUT_OFF_CORRECTION, evidence=evidence, message=message)
            evidence = f"{self._count} empty responses in a row (finish_reason={response.finish_reason or 'none'})"
            raise QualityError(KIND, CORRECTION, evidence=evidence, message=message)
        ctx.remind(CUT_OFF_NUDGE if cut_off else NUDGE)
        ctx.report(Level.WARNING, KIND, message)
