"""Remind a model that circles between a few successful calls without changing anything."""

from __future__ import annotations

from collections import deque
from typing import Callable, Sequence

from orchestrator.protocols import GuardContext
from orchestrator.records import BrokenCall, Level, ModelResponse, ToolCall, ToolResult

from guards._contents import FileVersions
from guards._normalise import SeenResults, call_key

KIND = "dead_loop"
REMINDER = (
    "You keep making the same few calls without changing anything. Stop looking at the same things "
    "again: decide on one change, make it with edit_file or write_file, then run the check."
)
# A model that circles after its check passed has finished (small models often never submit): the reminder
# above would send it to change the working code.
DONE_REMINDER = (
    "You keep making the same few calls, and your last run_check passed: the work is done. Do not change "
    "the code again; call submit with a one-line summary."
)

Progress = Callable[[Sequence[ToolCall], Sequence[ToolResult]], bool]


class DeadLoopGuard:
    """Fingerprints each round (the calls of one answer) and watches the last few.

    Every call may succeed, so the repeat and failure guards miss this. It only
    reminds: a false stop would cut real work short, a miss costs a few turns.

    Two shapes count as circling: the last `recent` rounds have at most
    `distinct` fingerprints (A B A B), or the rounds go round the same longer
    cycle twice and start a third time (A B C A B C A), which the distinct
    count alone would miss. Going round once more is a second look; a third
    time is circling.

    Progress clears the window: a successful write that leaves the file with
    content new for this run (not a flip back, not the same content again), or
    (without a custom `progress` callable) a call that now returns something it
    has not returned before, as a poll whose status changed. A result that
    differs only in its volatile parts (a duration, a timestamp) has not changed.
    """

    def __init__(
        self,
        window: int = 6,
        recent: int = 4,
        distinct: int = 2,
        progress_tools: Sequence[str] = ("write_file", "edit_file"),
        progress: Progress | None = None,
    ) -> None:
        self.window = max(window, recent)
        self.recent = recent
        self.distinct = distinct
        self.progress_tools = frozenset(progress_tools)
        self.progress = progress
        # One round more than the window: a cycle of window/2 rounds needs 2 turns plus one.
        self._rounds: deque[str] = deque(maxlen=self.window + 1)
        # Every result of each call since the last write: one not among them is news.
        self._seen = SeenResults()
        self._versions = FileVersions()
        self._workdir = None
        self._pending = 0
        self._calls: list[ToolCall] = []
        self._results: list[ToolResult] = []

    def before_run(self, ctx: GuardContext) -> None:
        self._rounds.clear()
        self._seen.clear()
        self._versions.clear()
        self._workdir = getattr(ctx, "workdir", None)
        self._start_round(0)

    def after_model_response(
        self, ctx: GuardContext, response: ModelResponse, calls: Sequence[ToolCall | BrokenCall]
    ) -> None:
        # Answers without a valid call run nothing; they neither open nor close a round.
        # One plain loop (this runs on every answer); the list of writes only when there is one.
        usable = 0
        writes = None
        progress_tools = self.progress_tools
        for c in calls:
            if isinstance(c, ToolCall):
                usable += 1
                if c.name in progress_tools:
                    if writes is None:
                        writes = []
                    writes.append(c)
        self._start_round(usable)
        if writes:
            self._versions.before(self._workdir, writes)

    def after_tool_call(self, ctx: GuardContext, call: ToolCall, result: ToolResult) -> None:
        self._calls.append(call)
        self._results.append(result)
        self._pending -= 1
        if self._pending <= 0:
            self._close_round(ctx)

    def _start_round(self, expected: int) -> None:
        self._pending = expected
        self._calls = []
        self._results = []

    def _close_round(self, ctx: GuardContext) -> None:
        calls, results = self._calls, self._results
        self._start_round(0)
        if self._made_progress(calls, results):
            self._rounds.clear()
            return
        self._rounds.append(round_print(calls))
        message = self._circling()
        if message is None:
            return
        self._rounds.clear()
        ctx.remind(DONE_REMINDER if ctx.check_passed else REMINDER)
        ctx.report(Level.WARNING, KIND, message)

    def _circling(self) -> str | None:
        rounds = list(self._rounds)
        if len(rounds) >= self.recent:
            distinct = len(set(rounds[-self.recent :]))
            if distinct <= self.distinct:
                return f"dead loop: {distinct} calls over {self.recent} rounds"
        for period in range(self.distinct + 1, (len(rounds) - 1) // 2 + 1):
            if _cycles(rounds, period):
                return f"dead loop: a cycle of {period} rounds, a third time"
        return None

    def _made_progress(self, calls: Sequence[ToolCall], results: Sequence[ToolResult]) -> bool:
        if self.progress is not None:
            return bool(self.progress(calls, results))
        progress_tools = self.progress_tools
        writes = [c for c, r in zip(calls, results) if r.ok and c.name in progress_tools]
        if writes and any([self._versions.new_after(self._workdir, c) for c in writes]):  # a list: every write is noted
            self._seen.clear()
            return True
        changed = False
        note = self._seen.note
        for call, result in zip(calls, results):
            # Every outcome is noted, so no short cut: a call's first result is no change, a new one is.
            if note(call.name, call_key(call), result.ok, result.output) == "new":
                changed = True
        return changed


def _cycles(rounds: Sequence[str], period: int) -> bool:
    """The last 2*period+1 rounds repeat with this period (A B C A B C A for 3)."""
    tail = rounds[-(2 * period + 1) :]
    return len(tail) == 2 * period + 1 and all(tail[i] == tail[i + period] for i in range(period + 1))


def round_print(calls: Sequence[ToolCall]) -> str:
    """Each call as `name:` + a hash of its whole noise-free key, sorted, joined.

    The whole key: calls sharing a long prefix (four test ids under one long path,
    one file paged by start_line) are different calls.
    """
    if len(calls) == 1:
        return f"{calls[0].name}:{hash(call_key(calls[0])):x}"
    prints = sorted(f"{c.name}:{hash(call_key(c)):x}" for c in calls)
    return "\n".join(prints)
