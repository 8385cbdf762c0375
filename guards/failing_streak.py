"""Warn when tool calls keep failing and nothing new happens in between; stop only when configured to."""

from __future__ import annotations

from typing import Sequence

from orchestrator.errors import QualityError
from orchestrator.protocols import GuardContext
from orchestrator.records import BrokenCall, Level, ModelResponse, ToolCall, ToolResult

from guards._contents import FileVersions
from guards._describe import describe_call, first_lines
from guards._normalise import RUNS_COMMANDS, AnswerCopies, SeenResults, call_key

KIND = "failing_streak"
# Lines of the last failure's output kept as evidence for notes.md.
_EVIDENCE_LINES = 3


class FailingStreakGuard:
    """Counts failed calls since the last successful call that returned something new.

    A success that only repeats what the model already saw (re-reading the same
    file between failed edits) does not end the streak: reads and failed edits in
    turn are the classic small-model circle; nor does a write that leaves a file
    as it was before in this run (flipping an edit back and forth). Copies of one
    call within a single answer count once, as for repeated_tool_call.

    A failing command (run_command, run_check) whose call and output are new for
    this run is news too: a probe with a new assertion value, a grep that finds
    nothing, a tool that is not installed. It ends the streak before it and is the
    first failure of a new one. A failed edit or write (or any other tool's
    failure) and a command failing again with the same output (durations and
    timestamps set aside) always count.

    From the `at`-th failure on it warns and reminds: the run goes on (a failing
    streak is a warning in the guard suite's contract). With a `stop_at` (0: none, the
    default) it stops at that failure, as the warnings went unheeded and nothing was
    learned in between, unless the check has passed since the last successful
    write: then the work is done and stopping would roll it back, so it only warns.
    """

    def __init__(
        self, at: int = 3, stop_at: int = 0, progress_tools: Sequence[str] = ("write_file", "edit_file")
    ) -> None:
        self.at = at
        self.stop_at = stop_at
        self.progress_tools = frozenset(progress_tools)
        self._streak = 0
        self._in_a_row = True  # no successful call inside the streak (its message says "in a row")
        self._seen: set[tuple[str, str]] = set()
        # Each failing command's outputs in this run.
        self._failed = SeenResults()
        self._passed = False
        self._versions = FileVersions()
        self._workdir = None
        self._copies = AnswerCopies()

    def before_run(self, ctx: GuardContext) -> None:
        self._streak = 0
        self._in_a_row = True
        self._seen = set()
        self._failed.clear()
        self._passed = False
        self._versions.clear()
        self._workdir = getattr(ctx, "workdir", None)
        self._copies.reset()

    def after_model_response(
        self, ctx: GuardContext, response: ModelResponse, calls: Sequence[ToolCall | BrokenCall]
    ) -> None:
        self._copies.start()
        progress_tools = self.progress_tools
        for c in calls:  # most answers write nothing: look before building a list
            if isinstance(c, ToolCall) and c.name in progress_tools:
                writes = [c for c in calls if isinstance(c, ToolCall) and c.name in progress_tools]
                self._versions.before(self._workdir, writes)
                return

    def after_tool_call(self, ctx: GuardContext, call: ToolCall, result: ToolResult) -> None:
        key = call_key(call)
        # Before the copies are passed over: they count once, but what they did happened. The check run again
        # after an edit in the same answer ([run_check, edit_file, run_check]) passed after that edit.
        if result.ok and call.name == "run_check":
            self._passed = True
        elif result.ok and call.name in self.progress_tools:
            self._passed = False
        if not self._copies.first(key):
            return  # a copy of a call earlier in the same answer: one decision, counted once
        if result.ok:
            if self._news(call, key, result):
                self._streak, self._in_a_row = 0, True
            elif self._streak:
                self._in_a_row = False
            return
        if call.name in RUNS_COMMANDS and self._failed.note(call.name, key, False, result.output) != "known":
            # A command failing with a new output is news: it ends the streak before it.
            self._streak, self._in_a_row = 1, True
        else:
            self._streak += 1
        if self._streak < self.at:
            return
        if self._in_a_row:
            message = f"failing: {self._streak} tool calls in a row"
        else:
            message = f"failing: {self._streak} failed calls, nothing new in between"
        if self.stop_at and self._streak >= self.stop_at and not self._passed:
            raise QualityError(KIND, _correction(self._streak), evidence=_evidence(call, result), message=message)
        ctx.remind(
            f"{self._streak} of your tool calls failed, and the calls between them showed nothing new. Stop and "
            "check your assumptions before trying again: read the error messages, call list_dir to see which "
            "files exist instead of guessing paths, and copy edit_file's `old` exactly from what read_file shows."
        )
        ctx.report(Level.WARNING, KIND, message)

    def _news(self, call: ToolCall, key: str, result: ToolResult) -> bool:
        if call.name in self.progress_tools:
            return self._versions.new_after(self._workdir, call)
        seen = (key, result.output)
        if seen in self._seen:
            return False
        self._seen.add(seen)
        return True


def _correction(count: int) -> str:
    return (
        f"Last time {count} tool calls failed, and the calls between them only showed what you had already "
        "seen. Read each error message before the next call. For edit_file, copy `old` exactly from what "
        "read_file shows, a few whole lines; check paths with list_dir; after two failures of one kind, "
        "try another way (a smaller edit, or read the file again first)."
    )


def _evidence(call: ToolCall, result: ToolResult) -> str:
    return f"{describe_call(call)} failed:\n" + first_lines(result.output, _EVIDENCE_LINES)
