"""Stop a model that makes the same call and gets the same answer again and again."""

from __future__ import annotations

from orchestrator.errors import QualityError
from orchestrator.protocols import GuardContext
from orchestrator.records import Level, ToolCall, ToolResult

from guards._describe import describe_call

KIND = "repeated_tool_call"


class RepeatedCallGuard:
    """Counts identical consecutive calls with identical results.

    The result is part of the identity: re-running the check after an edit, or
    reading a file again after changing it, returns something new and is progress.
    """

    def __init__(self, remind_at: int = 3, stop_at: int = 4) -> None:
        self.remind_at = remind_at
        self.stop_at = stop_at
        self._previous: tuple[str, bool, str] | None = None
        self._count = 0

    def before_run(self, ctx: GuardContext) -> None:
        self._previous = None
        self._count = 0

    def after_tool_call(self, ctx: GuardContext, call: ToolCall, result: ToolResult) -> None:
        key = (call.canonical, result.ok, result.output)
        self._count = self._count + 1 if key == self._previous else 1
        self._previous = key
        if self._count < self.remind_at and self._count < self.stop_at:
            return
        message = f"loop: {call.name} ×{self._count}"
        correction = _correction(call, self._count)
        if self._count >= self.stop_at:
            raise QualityError(KIND, correction, evidence=f"{describe_call(call)} ×{self._count}", message=message)
        ctx.remind(correction)
        ctx.report(Level.WARNING, KIND, message)


def _correction(call: ToolCall, count: int) -> str:
    return (
        f"You called {describe_call(call)} {count} times in a row and got the same result each time. "
        "Do not call it again. Use what it already returned, or do something different: "
        "change the code, look at another file, or run the check."
    )
