"""Stop a model that makes the same call and gets the same answer again and again."""

from __future__ import annotations

from typing import Sequence

from orchestrator.errors import QualityError
from orchestrator.protocols import GuardContext
from orchestrator.records import BrokenCall, Level, ModelResponse, ToolCall, ToolResult

from guards._describe import describe_call, first_lines
from guards._normalise import AnswerCopies, call_key, same_result

KIND = "repeated_tool_call"
# A result shorter than this ("exit code 0", "ok") says too little to call two different calls one loop.
_INFORMATIVE_CHARS = 32
# Results equal only without their volatile parts stop this many calls after `stop_at`.
_LOOSE_EXTRA = 2
# Lines of the repeated result kept as evidence for notes.md.
_EVIDENCE_LINES = 5


class RepeatedCallGuard:
    """Counts consecutive calls that repeat the one before with an identical result.

    The result is part of the identity: re-running the check after an edit, or
    reading a file again after changing it, returns something new and is progress.
    Arguments are compared without noise (`./a.py` is `a.py`, spaces squeezed), and
    results without their volatile parts (pytest's `in 0.02s`, timestamps).

    Only an exactly equal result stops at `stop_at`: one equal only once volatile
    parts are set aside (an elapsed time that advances while a job runs) reminds as
    usual but stops two calls later, so a poll is not cut off one look before it is
    done, while a pytest run repeated unchanged still stops.

    A looser streak, the same tool returning the same informative result while an
    argument keeps changing (`cat a.py`, `cat a.py 2>&1`), only reminds: its
    calls differ, so a stop could cut a legitimate sequence.

    The same call several times in one answer counts once: that burst is one
    decision of the model (the many-calls warning answers it), and counting each
    copy stopped a run at its first answer, before any reminder reached the model.
    """

    def __init__(
        self, remind_at: int = 3, stop_at: int = 4, progress_tools: Sequence[str] = ("write_file", "edit_file")
    ) -> None:
        self.remind_at = remind_at
        self.stop_at = stop_at
        self.progress_tools = frozenset(progress_tools)
        self._previous: tuple[str, str, bool, str] | None = None
        self._count = 0
        # The same streak, counting only exactly equal results.
        self._exact = 0
        self._loose_count = 0
        self._copies = AnswerCopies()

    def before_run(self, ctx: GuardContext) -> None:
        self._previous = None
        self._count = 0
        self._exact = 0
        self._loose_count = 0
        self._copies.reset()

    def after_model_response(
        self, ctx: GuardContext, response: ModelResponse, calls: Sequence[ToolCall | BrokenCall]
    ) -> None:
        self._copies.start()

    def after_tool_call(self, ctx: GuardContext, call: ToolCall, result: ToolResult) -> None:
        identity = call_key(call)
        if not self._copies.first(identity):
            return  # a copy of a call earlier in the same answer
        key = (call.name, identity, result.ok, result.output)
        previous, self._previous = self._previous, key
        if previous is not None and key == previous:
            self._count, self._exact = self._count + 1, self._exact + 1
        elif _same(key, previous):
            self._count, self._exact = self._count + 1, 1
        else:
            self._count = self._exact = 1
        self._loose_count = self._loose_count + 1 if self._loosely_same(key, previous) else 1
        if self._count >= self.remind_at or self._count >= self.stop_at:
            self._repeat(ctx, call, result)
        elif self._loose_count == self.remind_at:
            message = f"loop: {call.name} ×{self._loose_count} (varied arguments)"
            ctx.remind(_loose_correction(call, self._loose_count))
            ctx.report(Level.WARNING, KIND, message)

    def _repeat(self, ctx: GuardContext, call: ToolCall, result: ToolResult) -> None:
        message = f"loop: {call.name} ×{self._count}"
        if self._exact >= self.stop_at or self._count >= self.stop_at + _LOOSE_EXTRA:
            raise QualityError(KIND, _next_time(call, self._count), evidence=_evidence(call, self._count, result), message=message)
        ctx.remind(_correction(call, self._count, done=ctx.check_passed))
        ctx.report(Level.WARNING, KIND, message)

    def _loosely_same(self, key: tuple[str, str, bool, str], previous: tuple[str, str, bool, str] | None) -> bool:
        if previous is None or key[0] != previous[0] or key[0] in self.progress_tools:
            return False
        # Exact results here: these calls differ anyway, and comparing every pair without volatile parts costs.
        return key[2:] == previous[2:] and len(key[3].strip()) >= _INFORMATIVE_CHARS


def _same(key: tuple[str, str, bool, str], previous: tuple[str, str, bool, str] | None) -> bool:
    # The cheap parts first: the results are only compared for a call that is the same.
    return previous is not None and key[:3] == previous[:3] and same_result(key[0], key[3], previous[3])


def _next_time(call: ToolCall, count: int) -> str:
    """The correction for notes.md: read by the next attempt, whose run starts afresh (the call is still fine to make)."""
    return (
        f"Last time you made the call {describe_call(call)} {count} times in a row without changing anything in "
        "between, and it returned the same each time. Read what it returns once, then change something (the code, "
        "or what you ask for) before making it again."
    )


def _evidence(call: ToolCall, count: int, result: ToolResult) -> str:
    shown = first_lines(result.output, _EVIDENCE_LINES)
    return f"{describe_call(call)} ×{count}, the last returning:\n{shown}" if shown else f"{describe_call(call)} ×{count}"


def _loose_correction(call: ToolCall, count: int) -> str:
    # The calls differed: saying the same call was made N times would be false.
    return (
        f"Your last {count} calls to {call.name}, each with other arguments, all returned the same result. "
        "Use what it already returned, or do something different: change the code, look at another file, "
        "or run the check."
    )


def _correction(call: ToolCall, count: int, done: bool = False) -> str:
    if done:
        # The check passed and no call since may have changed a file: "change the code" sent a model that never submits
        # (small ones often don't) to undo its finished work. What is left to do is to submit.
        return (
            f"You called {describe_call(call)} {count} times in a row and got the same result each time. Do not call "
            "it again: your last run_check passed, so the work is done. Call submit with a one-line summary."
        )
    # Not "or run the check" to a model that just ran it four times: it would read that as its way out.
    instead = "change the code, or look at another file." if call.name == "run_check" else "change the code, look at another file, or run the check."
    return (
        f"You called {describe_call(call)} {count} times in a row and got the same result each time. "
        f"Do not call it again. Use what it already returned, or do something different: {instead}"
    )
