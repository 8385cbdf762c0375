"""Stop a model that keeps calling tools that do not exist."""

from __future__ import annotations

from typing import Sequence

from orchestrator.errors import QualityError
from orchestrator.protocols import GuardContext
from orchestrator.records import BrokenCall, Level, ModelResponse, ToolCall

from guards._describe import describe_call, name_for_message, quoted, times

UNKNOWN_TOOL = "unknown_tool"
EMPTY_TOOL_NAME = "empty_tool_name"
_PROBLEMS = (UNKNOWN_TOOL, EMPTY_TOOL_NAME)


class UnknownToolGuard:
    """Counts answers in a row that call a missing tool; the kind is the BrokenCall's problem.

    Only a warning at first: the loop already hands the tool list back to the model.
    An answer that also holds a usable call (`run_check` beside a made-up `think`)
    only warns: its usable calls run and are progress, which a stop would undo.
    """

    def __init__(self, stop_at: int = 2) -> None:
        self.stop_at = stop_at
        self._count = 0

    def before_run(self, ctx: GuardContext) -> None:
        self._count = 0

    def after_model_response(
        self, ctx: GuardContext, response: ModelResponse, calls: Sequence[ToolCall | BrokenCall]
    ) -> None:
        bad = None
        usable = False
        for c in calls:  # a plain loop: cheaper than a generator, on every answer
            if isinstance(c, ToolCall):
                usable = True
            elif bad is None and isinstance(c, BrokenCall) and c.problem in _PROBLEMS:
                bad = c
        if bad is None or usable:
            self._count = 0
        if bad is None:
            return
        if not usable:  # a usable call beside it: warned, not counted
            self._count += 1
        what = f"unknown tool: {name_for_message(bad.name)}" if bad.problem == UNKNOWN_TOOL else "empty tool name"
        message = f"{what}{times(self._count)}"
        if self._count >= self.stop_at:
            evidence = f"{describe_call(bad)} in {self._count} answers in a row"
            raise QualityError(bad.problem, _correction(bad, ctx.tool_names), evidence=evidence, message=message)
        ctx.report(Level.WARNING, bad.problem, message)


def _correction(bad: BrokenCall, tool_names: Sequence[str]) -> str:
    available = ", ".join(tool_names)
    if bad.problem == EMPTY_TOOL_NAME:
        return f"Your tool calls had no tool name. Every call must name one of these tools: {available}."
    return f"There is no tool named {quoted(bad.name)}. Call only these tools, spelled exactly: {available}."
