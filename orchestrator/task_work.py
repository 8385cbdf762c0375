"""A task's work under its lease: its worktree, its iterations' setup (toolbox, guards, budgets), and its iterations
until one ends the task: committed, parked, paused, cancelled, or out of iterations."""

from __future__ import annotations

import math
from datetime import datetime
from typing import TYPE_CHECKING, Sequence

from orchestrator.cancel import seconds_between
from orchestrator.config import TaskConfig
from orchestrator.confinement import Confinement
from orchestrator.ended_without_work import spent
from orchestrator.errors import Cancelled, ModelUnreachable
from orchestrator.foreign_checkout import WorktreeFolderTaken
from orchestrator.iteration import died_of_the_nights_signal, run_iteration
from orchestrator.iteration_setup import TaskSetup
from orchestrator.leases import LeaseKeeper
from orchestrator.protocols import Model
from orchestrator.records import IterationOutcome, IterationReport, TaskOutcome
from orchestrator.task_branches import BranchCheckedOut
from orchestrator.task_records import TaskEnded, TaskInNight
from orchestrator.tools import Toolbox, output_cap_for
from orchestrator.worktree import Worktree

if TYPE_CHECKING:
    from orchestrator.night_state import Night

PARK_CORRECTION = (
    "Parked for the night: the same problem stopped {iterations} in a row ({reason}). "
    "A person should look at the task or the model."
)
# A task skipped because its branch is checked out in another worktree (the user's, for review).
BRANCH_CHECKED_OUT = "branch_checked_out"


def worked(night: Night, run: TaskInNight, lease: LeaseKeeper) -> TaskEnded:
    """The task's iterations in its worktree, its first request asked ahead while the worktree is made."""
    asked = night.parts.now()
    with night.ask_ahead(run.task, run.task_run_id, run.log, run.cancel) as model:
        workspace = _worktree(night, run)
        if isinstance(workspace, TaskEnded):
            return workspace
        run.log.info("task_started", branch=workspace.branch)
        setup = _task_setup(night, run, workspace, model, lease=lease)
        return _iterate(night, run.task, setup, first_asked=asked, work_key=run.work_key)


def _worktree(night: Night, run: TaskInNight) -> Worktree | TaskEnded:
    """The task's worktree, or how the task ends without one."""
    try:
        return night.worktrees.of(run.task)
    except WorktreeFolderTaken as taken:
        # A person's repository where the worktree goes: what the idle cleaning leaves, the night leaves too.
        run.log.warning("worktree_folder_kept", task=run.task.name, at=taken.at, why=f"{taken.what}: left as it is, the task skipped")
        return TaskEnded(TaskOutcome.SKIPPED, reason=BRANCH_CHECKED_OUT)
    except BranchCheckedOut as taken:
        run.log.warning("task_skipped_branch_checked_out", at=taken.at)
        return TaskEnded(TaskOutcome.SKIPPED, reason=BRANCH_CHECKED_OUT)
    except Cancelled as stop:
        # The night stopped while the worktree was checked out (its git killed): the next night checks it out.
        return TaskEnded(TaskOutcome.CANCELLED, reason=stop.why)
    except Exception as failed:
        # Its git killed by the signal stopping the night (systemd's control-group kill, a moment
        # before the night's own handler runs; `git_status`: worktree_registration.with_git_status, `status`: a
        # GitCommandError): the task is cancelled, not a night crashed on a worktree git refused.
        if not died_of_the_nights_signal(run.cancel, getattr(failed, "git_status", getattr(failed, "status", None))):
            raise
        return TaskEnded(TaskOutcome.CANCELLED, reason=run.cancel.why)


def _iterate(night: Night, task: TaskConfig, setup: TaskSetup, *, first_asked: datetime, work_key: str) -> TaskEnded:
    """Iterations of one task until it succeeds, parks, pauses, is cancelled or runs out; and how many began.

    The first iteration is timed from `first_asked`, when its first request left (ahead, during
    the task's set-up): timed from its start, its first model call went uncounted, and a later
    iteration began that could not finish by the deadline. A scheduled night begun again goes on
    from its fire's earlier runs (`night.earlier`, by `work_key`): the iterations they began on the
    task count against `max_iterations` and toward `park_after`, and this run's numbers go on from
    theirs (notes.md's "iteration N" entries and the commits' subjects do not repeat one).
    """
    counted, last_number = night.earlier.counted(work_key), night.earlier.last_number.get(work_key, 0)
    endings = list(night.earlier.endings.get(work_key, ()))  # (outcome, reason) of each counted iteration
    parts, config = night.parts, night.parts.config
    reports: list[IterationReport] = []
    outcome, reason, detail, begun = TaskOutcome.FAILED, "", "", 0
    try:
        for number in range(last_number + 1, last_number + 1 + config.night.max_iterations - counted):
            if refused := night.why_not_start_iteration() or spent(setup.budgets):
                outcome, reason = TaskOutcome.CANCELLED, refused
                break
            begun += 1
            started = first_asked if begun == 1 else parts.now()
            report = run_iteration(setup, number)
            night.iteration_took(seconds_between(started, parts.now()))
            reports.append(report)
            endings.append((report.outcome.value, report.reason))
            if report.outcome is IterationOutcome.COMMITTED:
                outcome, reason = TaskOutcome.SUCCEEDED, ""
                break
            reason = report.reason
            # Also on the last iteration: "parked" tells the morning that more of the same would not
            # have helped, which "failed" does not (the repeated reason is in the iterations and the note).
            if _should_park(endings, config.guards.park_after):
                outcome = TaskOutcome.PARKED
                night.notes.append(
                    task=task.name,
                    iteration=number,
                    reason="parked",
                    correction=PARK_CORRECTION.format(iterations=_iterations(config.guards.park_after), reason=reason),
                )
                reason = "parked"
                break
    except ModelUnreachable as unreachable:
        # Which endpoint and what it answered, for the report's line: the model's client redacted its own secrets
        # in it, the night's redaction the rest a server may have quoted (the store's URL, the environment's).
        outcome, reason, detail = TaskOutcome.PAUSED, "model_unreachable", night.redact(str(unreachable))
    except Cancelled as stop:
        outcome, reason = TaskOutcome.CANCELLED, stop.why
    commit = next((report.commit for report in reports if report.commit), "")
    return TaskEnded(outcome, reason=reason, commit=commit, reports=tuple(reports), begun=begun, detail=detail)


def _task_setup(night: Night, run: TaskInNight, workspace: Worktree, model: Model, *, lease: LeaseKeeper) -> TaskSetup:
    parts, config, task = night.parts, night.parts.config, run.task
    on_signal = parts.on_signal.for_task(task.name) if hasattr(parts.on_signal, "for_task") else parts.on_signal
    return TaskSetup(
        task=task,
        night=config.night,
        workspace=workspace,
        model=model,
        toolbox=Toolbox(
            workspace.path,
            task.tools,
            check_command=task.check,
            check_timeout_s=config.night.check_timeout_s,
            command_timeout_s=config.night.command_timeout_s,
            max_output_chars=output_cap_for(parts.context_window),
            cancel=run.cancel,
            confinement=Confinement(branch=workspace.branch, shared_config=workspace.shared_config, config_copy=night.git_config_copy),
            pass_env=task.pass_env,
            redact=night.redact,
        ),
        guards=parts.guards_factory(),
        notes=night.notes,
        store=parts.store,
        task_run_id=run.task_run_id,
        transcripts_dir=night.transcripts_dir,
        on_signal=on_signal,
        log=run.log,
        context_window=parts.context_window,
        cancel=run.cancel,
        budgets=(night.task_budget(run.work_key), night.budget),
        lease=lease,
        redact=night.redact,
        # Rounded up: a tiny positive limit is at least a byte, never 0 (no limit).
        max_file_bytes=math.ceil(config.repo.max_file_mb * 1_000_000),
    )


def _should_park(endings: Sequence[tuple[str, str]], park_after: int) -> bool:
    """The same severe reason on `park_after` consecutive iterations (`endings`: (outcome, reason) of
    each, oldest first): more of the same will not help."""
    recent = endings[-park_after:]
    if len(recent) < park_after:
        return False
    reasons = {reason for _, reason in recent}
    return len(reasons) == 1 and all(outcome == IterationOutcome.ROLLED_BACK.value for outcome, _ in recent)


def _iterations(count: int) -> str:
    return "1 iteration" if count == 1 else f"{count} iterations"
