"""A night: every task in order, each through iterations until it succeeds or stops.

Exit codes are the public contract of `overnight run`:
0 every task succeeded; 1 at least one did not; 3 the model endpoint was unreachable.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from orchestrator.config import Config, TaskConfig
from orchestrator.errors import Cancelled, ModelUnreachable
from orchestrator.iteration import TaskSetup, run_iteration
from orchestrator.notes import NotesBook
from orchestrator.protocols import Guard, Model, SignalSink
from orchestrator.records import IterationOutcome, IterationReport, TaskOutcome
from orchestrator.worktree import Worktree

EXIT_OK, EXIT_TASKS_FAILED, EXIT_USAGE, EXIT_MODEL_UNREACHABLE = 0, 1, 2, 3
EXIT_SIGINT, EXIT_SIGTERM = 130, 143
PARK_CORRECTION = "Parked for the night: the same problem stopped {count} iterations in a row ({reason}). A person should look at the task or the model."


@dataclass(frozen=True)
class TaskSummary:
    name: str
    outcome: TaskOutcome
    reason: str
    commit: str
    iterations: tuple[IterationReport, ...]


@dataclass(frozen=True)
class NightResult:
    run_id: int
    exit_code: int
    tasks: tuple[TaskSummary, ...]


@dataclass(frozen=True)
class NightParts:
    """What the CLI builds and the night uses; tests build their own."""

    config: Config
    model: Model
    store: Any  # runs.store.RunStore
    guards_factory: Callable[[], Sequence[Guard]]
    on_signal: SignalSink
    log: Any
    context_window: int | None = None


def run_night(parts: NightParts) -> NightResult:
    config, store = parts.config, parts.store
    notes = NotesBook(config.state_dir / "notes.md")
    run_id = store.begin_run(config_path=str(config.source), pid=os.getpid(), host=socket.gethostname())
    log = parts.log.bind(run_id=run_id)
    log.info("night_started", tasks=len(config.task), model=config.model.name)
    summaries: list[TaskSummary] = []
    try:
        for task in config.task:
            summaries.append(_run_task(parts, task, run_id, notes, log))
    except (Cancelled, KeyboardInterrupt) as stop:
        exit_code = EXIT_SIGTERM if getattr(stop, "why", "") == "SIGTERM" else EXIT_SIGINT
        store.finish_run(run_id, status="cancelled", exit_code=exit_code)
        log.info("night_cancelled", exit_code=exit_code)
        raise
    exit_code = _exit_code(summaries)
    store.finish_run(run_id, status="finished", exit_code=exit_code)
    log.info("night_finished", exit_code=exit_code, succeeded=sum(s.outcome is TaskOutcome.SUCCEEDED for s in summaries))
    return NightResult(run_id=run_id, exit_code=exit_code, tasks=tuple(summaries))


def _run_task(parts: NightParts, task: TaskConfig, run_id: int, notes: NotesBook, night_log: Any) -> TaskSummary:
    config, store = parts.config, parts.store
    workspace = Worktree.ensure(config.repo_path, config.state_dir, task.name, config.repo.base, config.repo.keep)
    task_run_id = store.begin_task(run_id, name=task.name, branch=workspace.branch)
    log = night_log.bind(task=task.name, task_run_id=task_run_id)
    log.info("task_started", branch=workspace.branch)
    from orchestrator.tools import Toolbox

    setup = TaskSetup(
        task=task,
        night=config.night,
        workspace=workspace,
        model=parts.model,
        toolbox=Toolbox(
            workspace.path,
            task.tools,
            check_command=task.check,
            check_timeout_s=config.night.check_timeout_s,
            command_timeout_s=config.night.command_timeout_s,
        ),
        guards=parts.guards_factory(),
        notes=notes,
        store=store,
        task_run_id=task_run_id,
        transcripts_dir=config.state_dir / "transcripts",
        on_signal=parts.on_signal.for_task(task.name) if hasattr(parts.on_signal, "for_task") else parts.on_signal,
        log=log,
        context_window=parts.context_window,
    )
    reports: list[IterationReport] = []
    outcome, reason = TaskOutcome.FAILED, ""
    try:
        for number in range(1, config.night.max_iterations + 1):
            report = run_iteration(setup, number)
            reports.append(report)
            if report.outcome is IterationOutcome.COMMITTED:
                outcome, reason = TaskOutcome.SUCCEEDED, ""
                break
            reason = report.reason
            if number < config.night.max_iterations and _should_park(reports, config.guards.park_after):
                outcome = TaskOutcome.PARKED
                notes.append(
                    task=task.name,
                    iteration=number,
                    reason="parked",
                    correction=PARK_CORRECTION.format(count=config.guards.park_after, reason=reason),
                )
                break
    except ModelUnreachable:
        outcome, reason = TaskOutcome.PAUSED, "model_unreachable"
    except (Cancelled, KeyboardInterrupt):
        store.finish_task(task_run_id, outcome=TaskOutcome.CANCELLED.value, reason="cancelled")
        raise
    commit = next((r.commit for r in reports if r.commit), "")
    store.finish_task(task_run_id, outcome=outcome.value, reason=reason, commit=commit)
    log.info("task_finished", outcome=outcome.value, reason=reason, iterations=len(reports))
    return TaskSummary(name=task.name, outcome=outcome, reason=reason, commit=commit, iterations=tuple(reports))


def _should_park(reports: Sequence[IterationReport], park_after: int) -> bool:
    """The same severe reason on `park_after` consecutive iterations: more of the same will not help."""
    recent = reports[-park_after:]
    if len(recent) < park_after or len(reports) < 2:
        return False
    reasons = {r.reason for r in recent}
    return len(reasons) == 1 and all(r.outcome is IterationOutcome.ROLLED_BACK for r in recent)


def _exit_code(summaries: Sequence[TaskSummary]) -> int:
    if any(s.reason == "model_unreachable" for s in summaries):
        return EXIT_MODEL_UNREACHABLE
    if all(s.outcome is TaskOutcome.SUCCEEDED for s in summaries):
        return EXIT_OK
    return EXIT_TASKS_FAILED
