"""What an iteration works with: its task's setup, built once per task by the night, and what stays fixed for one
iteration once the store has it (orchestrator/iteration.py runs it, iteration_endings.py ends it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from orchestrator.agent import RunContext
from orchestrator.config import NightConfig, TaskConfig
from orchestrator.protocols import Guard, Model, NotesBook, SignalSink, Toolbox, Workspace
from orchestrator.transcript import Transcript


@dataclass(frozen=True)
class TaskSetup:
    """Everything an iteration of one task needs, built once per task by the night."""

    task: TaskConfig
    night: NightConfig
    workspace: Workspace
    model: Model
    toolbox: Toolbox
    guards: Sequence[Guard]
    notes: NotesBook
    store: Any  # runs.store.RunStore
    task_run_id: int
    transcripts_dir: Path
    on_signal: SignalSink
    log: Any  # a structlog logger bound to run and task
    context_window: int | None = None
    # Shared by the whole night (signals, deadline) and per task (token budgets).
    cancel: Any = None
    budgets: tuple[Any, ...] = ()
    lease: Any = None  # orchestrator.leases.LeaseKeeper: asked before committing
    redact: Callable[[str], str] = str  # the check's output through it (orchestrator/redactor.py)
    max_file_bytes: int = 0  # [repo] max_file_mb: a larger file is not committed (0: no limit)


@dataclass(frozen=True)
class Iteration:
    """What stays fixed for one iteration once the store has it: its task's setup, its number and id, the
    checkpoint it rolls back to, the agent run's context, its logger (bound to the ids) and its transcript."""

    setup: TaskSetup
    number: int
    id: int
    checkpoint: str
    ctx: RunContext
    log: Any
    transcript: Transcript
