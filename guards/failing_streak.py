"""Warn when tool calls keep failing, even when each attempt is different."""

from __future__ import annotations

from orchestrator.protocols import GuardContext
from orchestrator.records import Level, ToolCall, ToolResult

KIND = "failing_streak"


class FailingStreakGuard:
    """Counts failed calls in a row; from the `at`-th on, warns and reminds.

    Never stops the run: the model reads each failure already, and a hard stop
    would end runs that one more attempt would have saved.
    """

    def __init__(self, at: int = 3) -> None:
        self.at = at
        self._streak = 0

    def before_run(self, ctx: GuardContext) -> None:
        self._streak = 0

    def after_tool_call(self, ctx: GuardContext, call: ToolCall, result: ToolResult) -> None:
        if result.ok:
            self._streak = 0
            return
        self._streak += 1
        if self._streak < self.at:
            return
        ctx.remind(
            f"Your last {self._streak} tool calls failed. Stop and check your assumptions before "
            "trying again: read the error messages, call list_dir to see which files exist instead "
            "of guessing paths, and read a file before editing it."
        )
        ctx.report(Level.WARNING, KIND, f"failing: {self._streak} tool calls in a row")
