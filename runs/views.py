"""What the run store hands back: frozen snapshots, detached from the database.

Readers (the morning report, crash recovery, the CLI) get these instead of ORM
rows, so nothing they do can write to the store by accident.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterable

from orchestrator.records import Level, Signal

_SEVERITY = {Level.WARNING: 0, Level.SEVERE: 1}


def worst_signal(signals: Iterable[Signal]) -> Signal | None:
    """The signal that best explains an iteration: severe beats warning, then the latest wins."""
    worst: Signal | None = None
    for signal in signals:
        if worst is None or _SEVERITY[signal.level] >= _SEVERITY[worst.level]:
            worst = signal
    return worst


@dataclass(frozen=True)
class IterationView:
    """One iteration as stored, with its signals and how many calls it made."""

    id: int
    task_run_id: int
    task_name: str
    number: int
    outcome: str
    reason: str
    correction: str
    checkpoint: str
    commit: str
    turns: int
    tokens: int
    transcript: str
    pid: int
    started_at: datetime
    finished_at: datetime | None
    signals: tuple[Signal, ...] = ()
    model_calls: int = 0
    tool_calls: int = 0
    # Last sign of life of the owning process; recovery may use it to spot stale ones.
    heartbeat_at: datetime | None = None


@dataclass(frozen=True)
class TaskView:
    """One task within one run, with its iterations in order."""

    id: int
    name: str
    branch: str
    outcome: str
    reason: str
    commit: str
    iterations: tuple[IterationView, ...] = ()
    started_at: datetime | None = None
    finished_at: datetime | None = None
    # A first answer the task ended without taking: spent, but in no iteration (see TaskRun.unused_tokens).
    unused_tokens: int = 0
    # What its reason code alone does not say (see TaskRun.detail); "" when nothing.
    detail: str = ""

    @property
    def signals(self) -> tuple[Signal, ...]:
        """Every iteration's signals, in order: what the task's badge is chosen from."""
        return tuple(signal for iteration in self.iterations for signal in iteration.signals)

    @property
    def tokens(self) -> int:
        """Everything the task spent tonight: its iterations' tokens and its unused first answer's."""
        return sum(iteration.tokens for iteration in self.iterations) + self.unused_tokens


@dataclass(frozen=True)
class RunView:
    """One night, with its tasks in the order they were started."""

    id: int
    started_at: datetime
    finished_at: datetime | None
    status: str
    exit_code: int | None
    tasks: tuple[TaskView, ...] = ()
    pid: int = 0
    host: str = ""
    config_path: str = ""
    state_id: str | None = None
    # The `[night] deadline` instant the night worked to; None without one, or recorded before runs kept it.
    deadline: datetime | None = None

    @property
    def tokens(self) -> int:
        """Everything the night spent: its tasks' iterations and their unused first answers."""
        return sum(task.tokens for task in self.tasks)


@dataclass(frozen=True)
class LeaseView:
    """Who holds a task's lease, and until when unless renewed."""

    task: str
    owner: str
    acquired_at: datetime
    expires_at: datetime

    @property
    def host(self) -> str:
        return self.owner.split(":", 1)[0]

    @property
    def pid(self) -> int | None:
        parts = self.owner.split(":")
        return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None


@dataclass(frozen=True)
class EarlierTonight:
    """What a state dir's runs begun since a scheduled night's fire time did before this one: a night
    `serve` started again (restarted, or dead with it, within the misfire grace) goes on from there."""

    # By work key (a task's name, prompt and check: see runs.models.TaskRun.work_key).
    succeeded: dict[str, str] = field(default_factory=dict)  # its commit ("" when none was needed)
    tokens: dict[str, int] = field(default_factory=dict)  # tokens its iterations used
    # Tokens of first answers tasks ended without taking: the night's budget counted them, no task's did.
    unused_tokens: int = 0
    last_number: dict[str, int] = field(default_factory=dict)  # the highest iteration number it began, counted or not
    # (outcome, reason) of the latest of its task runs that began an iteration: how its work last ended.
    ended: dict[str, tuple[str, str]] = field(default_factory=dict)
    # (outcome, reason) of each of its iterations that count against `[night] max_iterations`, in order
    # (`park_after` counts on across runs): all it began but those `interrupted` (a killed process),
    # `cancelled` (deadline, signal, lease), cut short by an unreachable model or by overnight's own error.
    endings: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    # Seconds the longest of its ended iterations ran, any task's: what `[night] deadline` judges this run's first by.
    slowest_iteration_s: float = 0.0

    def counted(self, work_key: str) -> int:
        """How many of the work's iterations count against `[night] max_iterations`."""
        return len(self.endings.get(work_key, ()))

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens.values()) + self.unused_tokens
