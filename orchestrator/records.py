"""Immutable records that flow between the parts of a night.

Everything here is a frozen dataclass: once a model response, a tool call or a
signal has happened, nothing downstream may rewrite it.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any


class Level(str, enum.Enum):
    """How bad a struggle signal is."""

    # Noticed; the model was reminded and the run goes on.
    WARNING = "warning"
    # The iteration was stopped because of it.
    SEVERE = "severe"


class IterationOutcome(str, enum.Enum):
    """How one iteration ended."""

    # Still in progress (or its process died; recovery turns it into INTERRUPTED).
    RUNNING = "running"
    # The check passed and the work was committed on the task branch.
    COMMITTED = "committed"
    # The worktree went back to the checkpoint; `reason` says why.
    ROLLED_BACK = "rolled_back"
    # Stopped on purpose (signal, deadline): rolled back, nobody's fault.
    CANCELLED = "cancelled"
    # Found left running by a dead process and rolled back on the next start.
    INTERRUPTED = "interrupted"


class TaskOutcome(str, enum.Enum):
    """How a task ended for the night."""

    RUNNING = "running"
    # An iteration committed work that passed the check.
    SUCCEEDED = "succeeded"
    # Every iteration was spent without a passing check.
    FAILED = "failed"
    # Stopped early: the same severe reason kept coming back.
    PARKED = "parked"
    # The model endpoint was unreachable; the task will be tried again another night.
    PAUSED = "paused"
    # The night was cancelled while the task was running (signal, deadline, token budget).
    CANCELLED = "cancelled"
    # Another process holds the task's lease: it is being worked on elsewhere.
    SKIPPED = "skipped"


# A task skipped because another worker sharing the store finished it tonight (not a failure).
DONE_ELSEWHERE = "done_elsewhere"
# A task skipped because an earlier run of the same scheduled night finished it (serve restarted).
DONE_EARLIER_TONIGHT = "done_earlier_tonight"


def counts_as_succeeded(outcome: str, reason: str) -> bool:
    """Whether a task's ending is a success of the night: it succeeded, or was skipped as done already
    (`done_elsewhere`, `done_earlier_tonight`). The exit code and the CI summary's heading count the same."""
    return outcome == TaskOutcome.SUCCEEDED or reason in (DONE_ELSEWHERE, DONE_EARLIER_TONIGHT)


@dataclass(frozen=True)
class KeptOutOfCommit:
    """Files put back as at the checkpoint before a commit: they held a value the check got through `pass_env`."""

    paths: tuple[str, ...]
    names: tuple[str, ...]  # the variables whose values they held; never the values


@dataclass(frozen=True)
class RawToolCall:
    """A tool call as the model wrote it, before anything is parsed."""

    name: str
    arguments: str
    id: str = ""


@dataclass(frozen=True)
class ModelResponse:
    """One complete answer of the model to one request."""

    text: str
    tool_calls: tuple[RawToolCall, ...] = ()
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    finish_reason: str = ""
    # Reasoning text some models stream separately; kept for the transcript only.
    reasoning: str = ""

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class ToolCall:
    """A call that parsed and fits a tool's parameters, ready to execute."""

    name: str
    arguments: dict[str, Any]
    id: str = ""
    # "native" when the server returned it as a tool call, "text" when parsed from prose.
    source: str = "native"

    @property
    def canonical(self) -> str:
        """Name plus arguments in one stable form, so equal calls compare equal."""
        return f"{self.name} {json.dumps(self.arguments, sort_keys=True, ensure_ascii=False)}"


@dataclass(frozen=True)
class BrokenCall:
    """A call the model tried to make that cannot be executed.

    `problem` is one of "unparseable", "invalid", "unknown_tool", "empty_tool_name".
    """

    name: str
    raw_arguments: str
    problem: str
    detail: str
    id: str = ""
    source: str = "native"


@dataclass(frozen=True)
class ToolResult:
    """What a tool returned; `ok` is the tool's own judgement of success."""

    ok: bool
    output: str
    # Set by `submit`: the model says it is done.
    submitted: bool = False


@dataclass(frozen=True)
class Signal:
    """A struggle noticed by a guard, shown to people and never to the model."""

    level: Level
    kind: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"level": self.level.value, "kind": self.kind, "message": self.message}


@dataclass(frozen=True)
class AgentResult:
    """How an agent run that was not stopped by a guard ended."""

    summary: str
    turns: int
    tokens: int


@dataclass(frozen=True)
class CheckResult:
    """The task's check command, run in the worktree."""

    exit_code: int
    output: str
    timed_out: bool = False

    @property
    def passed(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class IterationReport:
    """What one iteration left behind, as the night runner sees it."""

    number: int
    outcome: IterationOutcome
    reason: str = ""
    commit: str = ""
    turns: int = 0
    tokens: int = 0
    signals: tuple[Signal, ...] = field(default_factory=tuple)
