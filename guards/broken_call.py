"""Stop a model whose tool-call arguments keep failing to parse or to fit."""

from __future__ import annotations

from typing import Sequence

from orchestrator.errors import QualityError
from orchestrator.protocols import GuardContext
from orchestrator.records import BrokenCall, Level, ModelResponse, ToolCall
from orchestrator.printable import shortened, visible

from guards._describe import describe_call, name_for_message, times

KIND = "broken_tool_call"
_PROBLEMS = ("unparseable", "invalid")
# `detail` may quote a parameter name the model made up, of any length.
_DETAIL_LIMIT = 200


class BrokenCallGuard:
    """Counts answers with broken arguments; only an answer with a good call resets.

    A text-only answer in between does not reset: a model that writes prose
    between broken calls has still not managed one usable call. An answer that
    holds a good call beside a broken one (a burst whose last call was cut off)
    only warns: its good calls run and are progress, which a stop would undo.
    """

    def __init__(self, stop_at: int = 3) -> None:
        self.stop_at = stop_at
        self._count = 0

    def before_run(self, ctx: GuardContext) -> None:
        self._count = 0

    def after_model_response(
        self, ctx: GuardContext, response: ModelResponse, calls: Sequence[ToolCall | BrokenCall]
    ) -> None:
        # Plain loops: a generator per answer costs more than the look (this runs on every answer).
        broken = None
        usable = False
        for c in calls:
            if isinstance(c, ToolCall):
                usable = True
            elif broken is None and isinstance(c, BrokenCall) and c.problem in _PROBLEMS:
                broken = c
        if usable:
            self._count = 0
        if broken is None:
            return
        if not usable:  # a usable call beside it: warned, not counted
            self._count += 1
        message = f"broken call: {name_for_message(broken.name) or '(no tool name)'}{times(self._count)}"
        if self._count >= self.stop_at:
            evidence = f"{describe_call(broken)}: {broken.problem} ({visible(shortened(broken.detail, _DETAIL_LIMIT))})"
            raise QualityError(KIND, _correction(broken), evidence=evidence, message=message)
        ctx.report(Level.WARNING, KIND, message)


def _correction(broken: BrokenCall) -> str:
    why = visible(shortened(broken.detail, _DETAIL_LIMIT))
    if not broken.name.strip():  # nothing named a tool: the whole call was unreadable, not its arguments
        return (
            f"Your tool calls could not be used ({why}). Write each call as one JSON object with the tool's "
            'name and its arguments, like {"name": "read_file", "arguments": {"path": "a.py"}}, and nothing else.'
        )
    return (
        f"Your calls to {name_for_message(broken.name)} could not be used ({why}). Give the arguments as one "
        "JSON object with every required parameter and nothing else. If the content is long, "
        "change the file in smaller pieces with edit_file."
    )
