"""Stop a model whose answers are each unusable in a different way.

Each of the empty-response, no-tool-call, unknown-tool and broken-call guards
counts only its own kind in a row, so a model that alternates them (prose, an
empty answer, a made-up tool, broken JSON) resets them all and is never
stopped. This guard counts every answer without a usable call since the last
one that had one.
"""

from __future__ import annotations

from typing import Sequence

from orchestrator.errors import QualityError
from orchestrator.protocols import GuardContext
from orchestrator.records import BrokenCall, ModelResponse, ToolCall
from orchestrator.printable import shortened, visible

from guards._describe import name_for_message

# What each kind of unusable answer is called in the evidence and the correction.
_WHAT = {
    "empty_response": "an empty answer",
    "no_tool_call": "prose without a call",
    "unknown_tool": "a tool that does not exist",
    "empty_tool_name": "a call without a tool name",
    "broken_tool_call": "arguments that could not be used",
}


class UnusableAnswersGuard:
    """Stops at the `stop_at`-th answer in a row without a usable call, when they were of mixed kinds.

    Answers all of one kind are left to that kind's own guard and threshold. The
    reason is the kind of the last answer, an existing reason code.
    """

    def __init__(self, stop_at: int = 3) -> None:
        self.stop_at = stop_at
        self._answers: list[tuple[str, str]] = []

    def before_run(self, ctx: GuardContext) -> None:
        self._answers = []

    def after_model_response(
        self, ctx: GuardContext, response: ModelResponse, calls: Sequence[ToolCall | BrokenCall]
    ) -> None:
        for c in calls:  # a plain loop: cheaper than any() over a generator, on every answer
            if isinstance(c, ToolCall):
                self._answers = []
                return
        self._answers.append(_kind(response, calls))
        kinds = {kind for kind, _ in self._answers}
        if len(self._answers) < self.stop_at or len(kinds) < 2:
            return
        count, last = len(self._answers), self._answers[-1][0]
        evidence = f"{count} answers in a row without a usable tool call: " + "; ".join(seen for _, seen in self._answers)
        raise QualityError(last, _correction(kinds, ctx.tool_names), evidence=evidence, message=f"no usable call ×{count}")


def _kind(response: ModelResponse, calls: Sequence[ToolCall | BrokenCall]) -> tuple[str, str]:
    """The answer's kind (a reason code) and a few words on what it held."""
    if calls:
        bad = next(c for c in calls if isinstance(c, BrokenCall))  # no call was usable
        kind = bad.problem if bad.problem in ("unknown_tool", "empty_tool_name") else "broken_tool_call"
        return kind, f"{_WHAT[kind]} ({name_for_message(bad.name)})"
    text = response.text.strip()
    if text or response.tool_calls:
        return "no_tool_call", f"{_WHAT['no_tool_call']} ({visible(shortened(text, 60))!r})"
    return "empty_response", _WHAT["empty_response"]


def _correction(kinds: set[str], tool_names: Sequence[str]) -> str:
    what = ", ".join(_WHAT[kind] for kind in _WHAT if kind in kinds)
    return (
        f"None of your answers made a usable tool call ({what}). Every answer must contain exactly one "
        f"call to one of these tools, spelled exactly, with its arguments as one JSON object: {', '.join(tool_names)}."
    )
