"""The architecture at a glance.

A night (`night.run_night`) works through tasks. Each task has a `Workspace`
(a git worktree on its own branch). Each attempt at a task is an iteration
(`iteration.run_iteration`): checkpoint the workspace, run the agent loop
(`agent.run_agent`) with a `Model`, a `Toolbox` and `Guard`s, then run the
task's check and commit, or roll back and append a note.

Implementations are duck-typed: anything with these methods will do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from orchestrator.records import (
    BrokenCall,
    CheckResult,
    KeptOutOfCommit,
    Level,
    ModelResponse,
    Signal,
    ToolCall,
    ToolResult,
)

Message = dict[str, Any]
SignalSink = Callable[[Signal], None]


class Model(Protocol):
    """Answers a conversation; may stream internally but returns one whole response."""

    def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> ModelResponse:
        """Raises QualityError (watchdog_timeout, runaway_output) or ModelUnreachable."""
        ...


class Toolbox(Protocol):
    """The tools one task may use, bound to its worktree."""

    def names(self) -> list[str]: ...

    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI-style function schemas for the request."""
        ...

    def parse(self, response: ModelResponse) -> list[ToolCall | BrokenCall]:
        """Every call the response makes, native or written as text, checked against the tools."""
        ...

    def execute(self, call: ToolCall) -> ToolResult: ...


class GuardContext(Protocol):
    """What a guard may see and do during one agent run."""

    turn: int
    max_turns: int
    tool_names: list[str]
    # Tokens the model can take in, when known (litellm's model info or config).
    context_window: int | None
    # The worktree the tools act on: guards may read files there (not write them).
    workdir: Path | None
    # The model's last run_check passed and no call since may have changed a file: its work is done
    # unless it changes more (a reminder then says submit, not "change the code").
    check_passed: bool

    def remind(self, text: str) -> None:
        """Attach `text` to the next request only; it never enters the history."""
        ...

    def report(self, level: Level, kind: str, message: str) -> None:
        """Emit a struggle signal (shown to people, never to the model)."""
        ...

    def prompt_tokens(self) -> int:
        """Prompt tokens of the latest request, as the server counted them."""
        ...


class Guard(Protocol):
    """Watches one agent run. Each hook may do nothing, remind, report, or raise QualityError.

    A guard is a plain object; every hook is optional (the loop checks with getattr).
    """

    def before_run(self, ctx: GuardContext) -> None: ...

    def after_model_response(
        self, ctx: GuardContext, response: ModelResponse, calls: Sequence[ToolCall | BrokenCall]
    ) -> None: ...

    def after_tool_call(self, ctx: GuardContext, call: ToolCall, result: ToolResult) -> None: ...


class Workspace(Protocol):
    """A task's git worktree: the only place an agent may change."""

    path: Any
    branch: str
    shared_config: Any  # the repository's config file, shared with the user's checkout

    def checkpoint(self) -> str:
        """The commit to roll back to."""
        ...

    def rollback(self, checkpoint: str) -> None:
        """Back to `checkpoint` exactly: modified, new (ignored too) and deleted files."""
        ...

    def commit(
        self, message: str, onto: str | None = None, max_file_bytes: int = 0, secrets: Any = None,
        on_kept_out: Callable[[KeptOutOfCommit], None] | None = None,
    ) -> str:
        """Everything in the worktree, committed on the task's branch on top of `onto` (the checkpoint); the new HEAD.
        QualityError (`file_too_large`) for a file of more than `max_file_bytes` (0: no limit). A file holding a value
        of `secrets` (passed_secrets.PassedSecrets) that its checkpoint version did not is put back, `on_kept_out` told."""
        ...

    def run_check(
        self, command: str, timeout_s: float, cancel: Any = None, pass_env: Sequence[str] = (), redact: Callable[[str], str] = str
    ) -> CheckResult: ...


class NotesBook(Protocol):
    """notes.md: what went wrong, for the next iteration and the morning."""

    def append(self, *, task: str, iteration: int, reason: str, correction: str, evidence: str) -> None: ...

    def for_task(self, task: str) -> list[str]: ...

    def for_prompt(self, task: str, budget_chars: int) -> str:
        """The task's entries a person wrote into, then its newest others, as fit in the budget, for the next prompt."""
        ...
