"""The agent loop: ask the model, run its tool calls, let the guards watch.

Guards stop a run by raising QualityError; it is caught once here, turned into
a severe signal, and re-raised for the iteration runner to roll back. A guard
that crashes (any other exception, a bug in it) is logged as `guard_error`,
reported as a warning, and left out for the rest of the run: the model's work
is not rolled back for it.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from orchestrator import history
from orchestrator.errors import Cancelled, QualityError, StateError
from orchestrator.logs import get_logger
from orchestrator.protocols import Guard, Message, Model, SignalSink, Toolbox
from orchestrator.records import AgentResult, BrokenCall, Level, ModelResponse, Signal, ToolCall, ToolResult

# Tools that change no file: after a passing run_check, calls to these leave it passed.
LOOKING_TOOLS = frozenset({"read_file", "list_dir", "search", "submit"})
NO_TOOL_CALLED = (
    "You did not call a tool. Use the tools to make progress; when the check passes, call submit with a one-line summary."
)


class Recorder(Protocol):
    """Where the loop leaves its trace (run store, transcript); never read back by the loop."""

    def message(self, message: Message) -> None: ...

    def model_call(self, response: ModelResponse) -> None: ...

    def tool_call(self, call: ToolCall, result: ToolResult) -> None: ...


@dataclass
class RunContext:
    """The guards' view of one agent run (implements protocols.GuardContext)."""

    max_turns: int
    tool_names: list[str]
    sink: SignalSink
    context_window: int | None = None
    # orchestrator.cancel.CancelToken and TokenBudgets: stopping on purpose, never a struggle.
    cancel: Any = None
    budgets: Sequence[Any] = ()
    # The worktree the tools work in (the toolbox's root when not given): guards may read files there.
    workdir: Any = None
    # The iteration's logger (bound to its run, task and iteration ids); a bare one when not given.
    log: Any = None
    # The night's redaction (orchestrator/redactor.py): a guard's or a tool's error, or a signal's message, may quote a
    # secret (a path named after a token, a value a user's guard read), and goes to the log and the run store.
    redact: Callable[[str], str] = str
    turn: int = 0
    # Turns whose answer came (whole, or cut off as the model's: silence, runaway): a turn refused
    # by a budget or a cancel, or whose request found no server, is no turn of the model's.
    answered: int = 0
    # Tokens this run has used so far, whatever ends it.
    tokens: int = 0
    # The model's last run_check passed, and no call that may change files came after it: a run a
    # guard stops now may still hold finished work (orchestrator.iteration keeps it if the check agrees).
    check_passed: bool = False
    signals: list[Signal] = field(default_factory=list)
    _reminders: list[str] = field(default_factory=list)
    _prompt_tokens: int = 0

    def remind(self, text: str) -> None:
        if text not in self._reminders:
            self._reminders.append(text)

    def report(self, level: Level, kind: str, message: str) -> None:
        # A signal goes to the log and the run store: a guard's message (a user's guard quoting what it read, a stop's
        # evidence) may hold a secret. Signals are few (not one a tool call), so this costs nothing per call.
        signal = Signal(level=level, kind=kind, message=self.redact(message))
        self.signals.append(signal)
        self.sink(signal)

    def prompt_tokens(self) -> int:
        return self._prompt_tokens

    def check_cancelled(self) -> None:
        if self.cancel is not None:
            self.cancel.raise_if_cancelled()

    def spend(self, tokens: int) -> None:
        """Count tokens the run used, in this run and every budget (each, before any says it is spent)."""
        self.tokens += tokens
        for budget in self.budgets:
            budget.spend(tokens)

    def check_budgets(self) -> None:
        for budget in self.budgets:
            budget.raise_if_spent()

    def take_reminders(self) -> list[str]:
        reminders, self._reminders = self._reminders, []
        return reminders


def run_agent(
    model: Model,
    toolbox: Toolbox,
    guards: Sequence[Guard],
    messages: list[Message],
    ctx: RunContext,
    recorder: Recorder,
) -> AgentResult:
    """Run until the model submits; raise QualityError when a guard (or the model client) stops it."""
    if ctx.workdir is None:
        ctx.workdir = getattr(toolbox, "root", None)
    guards = list(guards)  # a guard that crashes leaves this list
    try:
        _each(guards, "before_run", ctx)
        for ctx.turn in range(1, ctx.max_turns + 1):
            ctx.check_cancelled()
            # Asked before a call, not after: the response that crossed a budget is still acted on.
            ctx.check_budgets()
            request = history.with_reminders(history.fitted(messages, ctx.context_window), ctx.take_reminders())
            response = _complete(model, request, toolbox.schemas(), ctx)
            ctx._prompt_tokens = response.prompt_tokens
            recorder.model_call(response)
            ctx.spend(response.tokens)
            calls = toolbox.parse(response)
            _each(guards, "after_model_response", ctx, response, calls)
            submitted = _act(toolbox, guards, messages, ctx, recorder, response, calls)
            if submitted is not None:
                return AgentResult(summary=submitted, turns=ctx.turn, tokens=ctx.tokens)
        raise QualityError(
            "max_turns",
            f"You used all {ctx.max_turns} turns without submitting. Make a smaller change, "
            "run the check, and submit as soon as it passes.",
            evidence=f"{ctx.max_turns} turns",
            message=f"max turns: {ctx.max_turns}",
        )
    except QualityError as stop:
        ctx.report(Level.SEVERE, stop.reason, stop.message)
        raise


def _complete(model: Model, request: list[Message], schemas: Sequence[dict[str, Any]], ctx: RunContext) -> ModelResponse:
    try:
        response = model.complete(request, schemas)
    except QualityError as stop:
        ctx.spend(stop.tokens)  # a response cut off (runaway, silence) used tokens too
        ctx.answered = ctx.turn
        raise
    except Cancelled as stop:
        # One the deadline or a signal cut off mid-stream too: the morning's figures, and a night begun again, count them.
        ctx.spend(stop.tokens)
        raise
    ctx.answered = ctx.turn
    return response


def _act(
    toolbox: Toolbox,
    guards: list[Guard],
    messages: list[Message],
    ctx: RunContext,
    recorder: Recorder,
    response: ModelResponse,
    calls: Sequence[ToolCall | BrokenCall],
) -> str | None:
    """Answer one response in the history; return the summary if the model submitted."""
    if not calls and not response.text.strip():
        return None  # an empty answer leaves no trace; the empty-response guard reminds
    turn_messages = history.assistant_turn(response, calls, ctx.turn)
    _append(messages, recorder, turn_messages.assistant)
    feedback: list[str] = []
    for call in calls:
        if isinstance(call, BrokenCall):
            feedback.append(history.broken_call_note(call, ctx.tool_names))
            continue
        ctx.check_cancelled()
        result = _executed(toolbox, call, ctx)
        recorder.tool_call(call, result)
        if call.name == "run_check" or call.name not in LOOKING_TOOLS:
            ctx.check_passed = call.name == "run_check" and result.ok
        if call.source == "native":
            _append(messages, recorder, history.tool_message(turn_messages.ids[id(call)], result))
        else:
            feedback.append(history.text_call_result(call, result))
        _each(guards, "after_tool_call", ctx, call, result)
        if result.submitted:
            return str(call.arguments.get("summary", ""))
    if not calls:
        feedback.append(NO_TOOL_CALLED)
    if feedback:
        _append(messages, recorder, {"role": "user", "content": "\n\n".join(feedback)})
    return None


def _executed(toolbox: Toolbox, call: ToolCall, ctx: RunContext) -> ToolResult:
    """The tool's result; a failed one when what the model gave it nests too deeply for Python (a
    search through a folder tree a thousand levels deep, a write_file under as many new folders).

    That RecursionError ended the iteration as iteration_error, the model's work rolled back, for an
    input the model can change as it does any other refused one. Logged with its traceback
    (`tool_error`): should it be a bug of overnight's after all, it is seen, not swallowed."""
    try:
        return toolbox.execute(call)
    except RecursionError as exc:
        error = ctx.redact(f"{type(exc).__name__}: {exc}")
        (ctx.log or get_logger()).warning("tool_error", tool=call.name, error=error, turn=ctx.turn, exception=_traceback(exc, ctx))
        return ToolResult(
            False,
            f"{call.name} failed: what it was given nests too deeply to handle ({error}); "
            "use a shorter path, a narrower folder or a simpler pattern",
        )


def _append(messages: list[Message], recorder: Recorder, message: Message) -> None:
    messages.append(message)
    recorder.message(message)


def _each(guards: list[Guard], hook: str, ctx: RunContext, *args: Any) -> None:
    for guard in list(guards):
        method = getattr(guard, hook, None)
        if method is None:
            continue
        try:
            method(ctx, *args)
        except (QualityError, Cancelled, StateError):
            # StateError: the run store or the state dir failed under the guard's ctx.report (a batch of events
            # the store could not write is raised once, at the next write). Not a bug in the guard: left out, it
            # watched no more, and the failure it swallowed never ended the night as a store failure does.
            raise
        except Exception as exc:  # a bug in the guard, often a user's: not the model's fault
            # By identity: two guards may compare equal (a dataclass with the same fields), and the healthy one must stay.
            del guards[next(i for i, g in enumerate(guards) if g is guard)]
            _guard_failed(ctx, type(guard).__name__, hook, exc)


def _guard_failed(ctx: RunContext, name: str, hook: str, exc: Exception) -> None:
    error = ctx.redact(f"{type(exc).__name__}: {exc}")
    (ctx.log or get_logger()).warning("guard_error", guard=name, hook=hook, error=error, turn=ctx.turn, exception=_traceback(exc, ctx))
    ctx.report(Level.WARNING, "guard_error", f"guard {name} failed in {hook} ({error[:120]}); left out for this run")


def _traceback(exc: BaseException, ctx: RunContext) -> str:
    """`exc`'s traceback, the exceptions it was raised in included (an OSError quoting a path named after a token),
    through the night's redaction: what structlog's `exception` field (format_exc_info) would hold, shown as it shows it."""
    return ctx.redact("".join(traceback.format_exception(exc)).rstrip("\n"))
