"""What the parts of one task's night pass each other: the task's run in the night, the same through all its tries, and
how its night ended (orchestrator/task_night.py records that and tells it the night)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.cancel import CancelToken
from orchestrator.config import TaskConfig
from orchestrator.records import IterationReport, TaskOutcome


@dataclass(frozen=True)
class TaskInNight:
    """A task's run in this night, the same through all its tries: its row, the log bound to it, its own stop."""

    task: TaskConfig
    work_key: str
    task_run_id: int
    log: Any
    # The night's stop, or its lease lost to another worker (this process stalled past the lease's ttl), which
    # ends this task's work and no other's. One for all its tries: each a new child of the night's stayed on it
    # (a hook every LEASE_POLL_S). Released as the task ends (task_night._finished).
    cancel: CancelToken


@dataclass(frozen=True)
class TaskEnded:
    """How a task's night ended: what its row records and its summary tells."""

    outcome: TaskOutcome
    reason: str
    commit: str = ""
    reports: tuple[IterationReport, ...] = ()
    begun: int = 0  # iterations begun: a cancelled or unreachable one ends with no report
    detail: str = ""  # what `reason` alone does not say (TaskRun.detail), redacted
