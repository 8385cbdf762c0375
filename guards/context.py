"""Warn once when the conversation nears the model's context window."""

from __future__ import annotations

from typing import Sequence

from orchestrator.protocols import GuardContext
from orchestrator.records import BrokenCall, Level, ModelResponse, ToolCall

KIND = "context_full"


class ContextGuard:
    """Compares the latest prompt size with the window; reports once per run."""

    def __init__(self, warn_ratio: float = 0.8) -> None:
        self.warn_ratio = warn_ratio
        self._warned = False

    def before_run(self, ctx: GuardContext) -> None:
        self._warned = False

    def after_model_response(
        self, ctx: GuardContext, response: ModelResponse, calls: Sequence[ToolCall | BrokenCall]
    ) -> None:
        window = getattr(ctx, "context_window", None)
        if self._warned or not window:
            return
        used = ctx.prompt_tokens()
        if used < self.warn_ratio * window:
            return
        self._warned = True
        percent = int(100 * used // window)
        ctx.remind(
            f"The conversation is {percent}% full. Keep each step small: read only the part of a "
            "file you need, make one change at a time, and submit as soon as the check passes."
        )
        ctx.report(Level.WARNING, KIND, f"context {percent}% full")
