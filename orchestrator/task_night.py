"""One task's night: its row, its lease, its iterations, and how it ends.

The night (orchestrator/night.py) submits `run_task` for each task to its pool and follows each task's
futures to its summary (`summary_of`). A task whose lease another live worker holds is set aside: its
later tries are submitted to the same pool (`Night.set_aside`) until the lease is free or the night
stops waiting. This module uses the public surface of `Night` (orchestrator/night_state.py) only; the
night imports it, not the reverse.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from orchestrator.cancel import CancelToken, TokenBudget, seconds_between
from orchestrator.config import TaskConfig
from orchestrator.confinement import Confinement
from orchestrator.errors import Cancelled, ModelUnreachable
from orchestrator.iteration import TaskSetup, died_of_the_nights_signal, run_iteration
from orchestrator.leases import DEFAULT_TTL_S, LeaseHeld, LeaseKeeper, new_owner
from orchestrator.protocols import Model
from orchestrator.records import DONE_EARLIER_TONIGHT, DONE_ELSEWHERE, IterationOutcome, IterationReport, TaskOutcome
from orchestrator.task_branches import BranchCheckedOut, branch_for
from orchestrator.tools import Toolbox, output_cap_for
from orchestrator.worktree import Worktree

if TYPE_CHECKING:
    from orchestrator.night_state import Night

# How often a task set aside for a lease another live worker holds asks for it again: a quarter of the
# holder's heartbeat (ttl/3), so a lease let go is taken up within seconds, at a few short statements per waiting
# task (the run's heartbeat, whether the work was done elsewhere, the lease asked for).
LEASE_POLL_S = DEFAULT_TTL_S / 12
PARK_CORRECTION = (
    "Parked for the night: the same problem stopped {iterations} in a row ({reason}). "
    "A person should look at the task or the model."
)
# A task not worked again because an earlier run of the same scheduled night spent its iterations
# on it (outcome failed), or parked it (outcome parked): a night begun again is not a second night.
FAILED_EARLIER_TONIGHT = "failed_earlier_tonight"
PARKED_EARLIER_TONIGHT = "parked_earlier_tonight"
# A task skipped because its branch is checked out in another worktree (the user's, for review).
BRANCH_CHECKED_OUT = "branch_checked_out"


@dataclass(frozen=True)
class TaskSummary:
    name: str
    outcome: TaskOutcome
    reason: str
    commit: str
    iterations: tuple[IterationReport, ...]


@dataclass(frozen=True)
class _TaskRun:
    """A task's run in this night, the same through all its tries: its row, the log bound to it, its own stop."""

    task: TaskConfig
    work_key: str
    task_run_id: int
    log: Any
    # The night's stop, or its lease lost to another worker (this process stalled past the lease's ttl), which
    # ends this task's work and no other's. One for all its tries: each a new child of the night's stayed on it
    # (a hook every LEASE_POLL_S).
    cancel: CancelToken


@dataclass(frozen=True)
class _Ended:
    """How a task's night ended: what its row records and its summary tells."""

    outcome: TaskOutcome
    reason: str
    commit: str = ""
    reports: tuple[IterationReport, ...] = ()
    begun: int = 0  # iterations begun: a cancelled or unreachable one ends with no report
    detail: str = ""  # what `reason` alone does not say (TaskRun.detail), redacted


@dataclass(frozen=True)
class _Waiting:
    """A set-aside task between its tries: its run, the lease's holder, and when it last asked."""

    run: _TaskRun
    holder: str
    asked_at: float  # time.monotonic()


@dataclass(frozen=True)
class _SetAside:
    """A task whose lease another live worker holds, queued again behind the night's other tasks: its
    summary is its next try's."""

    next_try: Future[Any]


def summary_of(future: Future[Any]) -> TaskSummary:
    """A task's summary, through the tries it was set aside for (each task's first future is followed)."""
    result = future.result()
    while isinstance(result, _SetAside):
        result = result.next_try.result()
    return result


def run_task(night: Night, task: TaskConfig) -> TaskSummary | _SetAside:
    """One task's night, from its first try. An error out of it or a later try (the state dir failing, a
    worktree git cannot make, a bug) ends the night (the run `crashed`): the other tasks' iterations in
    flight end as they would, and no task or iteration starts after it; such tasks are `cancelled`, reason
    `night_crashed`."""
    with _an_error_ends_the_night(night):
        return _first_try(night, task)


def _try_again(night: Night, waiting: _Waiting) -> TaskSummary | _SetAside:
    """A set-aside task's next try, once LEASE_POLL_S has passed since its last (a stop ends the pause)."""
    if (pause := LEASE_POLL_S - (time.monotonic() - waiting.asked_at)) > 0:
        night.waits_over.wait(pause)
    with _an_error_ends_the_night(night):
        return _later_try(night, waiting)


@contextlib.contextmanager
def _an_error_ends_the_night(night: Night) -> Iterator[None]:
    """An error out of a task's try ends the night (see run_task), and is raised on to it."""
    try:
        yield
    except Exception:
        night.crash()
        raise


def _first_try(night: Night, task: TaskConfig) -> TaskSummary | _SetAside:
    """The task's row recorded, then the task ended without work if it must be, else worked under its lease; one
    whose lease another live worker holds is `done_elsewhere` if the store records the work done, else set aside."""
    run = _begin(night, task)
    # Refused before its first request is asked ahead: a task whose budget the earlier runs spent costs no call.
    if ended := _ended_earlier(night, run) or _refused(night, run):
        return _finished(night, run, _recorded(night, run, ended))
    try:
        return _under_lease(night, run, taken=_done_elsewhere)
    except LeaseHeld as held:
        # The store asked before the first wait, as at each later try: a holder killed between recording the
        # task done and letting its lease go would cost a LEASE_POLL_S for nothing.
        if ended := _done_elsewhere(night, run):
            return _finished(night, run, _recorded(night, run, ended))
        return _wait_for_lease(night, _Waiting(run, str(held), time.monotonic()), first=True)


def _later_try(night: Night, waiting: _Waiting) -> TaskSummary | _SetAside:
    """A set-aside task tried again: `done_elsewhere` if the holder (or another worker) recorded the work done,
    whatever its lease says; else recorded as one it found held if the night stopped waiting meanwhile, else
    worked under its lease once that is free, or set aside again."""
    run = waiting.run
    # A night whose tasks all wait writes nothing else: without this, a kill -9 was dated to the wait's start.
    night.parts.store.heartbeat_run(night.run_id)
    # The earlier runs' ending asked again as on the first try, which it did not end (the store is asked as then).
    # The store asked before the lease: a holder killed between recording the task done and letting its lease
    # go holds it until its ttl lapses. Done only on success: one the holder failed or parked is worked once free.
    if ended := _ended_earlier(night, run) or _done_elsewhere(night, run) or (_leased(waiting) if night.why_stop_waiting() else None):
        return _finished(night, run, _recorded(night, run, ended))
    try:
        return _under_lease(night, run, taken=_taken_again)
    except LeaseHeld as held:
        return _wait_for_lease(night, _Waiting(run, str(held), time.monotonic()), first=False)


def _begin(night: Night, task: TaskConfig) -> _TaskRun:
    """The task's row, recorded even when it cannot start (deadline, budget, signal): the morning's report
    and the CI's test cases list every task of the night, not only those that began."""
    work_key, store = night.work_key(task), night.parts.store
    task_run_id = store.begin_task(night.run_id, name=task.name, branch=branch_for(task.name), work_key=work_key, position=night.position(task))
    log = night.log.bind(task=task.name, task_run_id=task_run_id)
    night.worktrees.task_began(task, log)
    return _TaskRun(task, work_key, task_run_id, log, cancel=night.parts.cancel.child())


def _under_lease(night: Night, run: _TaskRun, *, taken: Callable[[Night, _TaskRun], _Ended | None]) -> TaskSummary:
    """The task ended under its lease: as `taken` says once the lease is held, else worked; its end recorded
    before the lease is let go, so a worker that takes it next sees the task done. Raises LeaseHeld while
    another live worker holds the lease."""
    owner, store = new_owner(night.state_id), night.parts.store
    lease = LeaseKeeper(store, night.lease_key(run.task), owner=owner, on_lost=lambda: run.cancel.cancel("lease_lost"), log=run.log)
    with lease:
        ended = _recorded(night, run, taken(night, run) or _worked(night, run, lease))
    return _finished(night, run, ended)


def _worked(night: Night, run: _TaskRun, lease: LeaseKeeper) -> _Ended:
    """The task's iterations in its worktree, its first request asked ahead while the worktree is made."""
    asked = night.parts.now()
    with night.ask_ahead(run.task, run.task_run_id, run.log) as model:
        workspace = _worktree(night, run)
        if isinstance(workspace, _Ended):
            return workspace
        run.log.info("task_started", branch=workspace.branch)
        setup = _task_setup(night, run, workspace, model, lease=lease)
        return _iterate(night, run.task, setup, first_asked=asked, work_key=run.work_key)


def _worktree(night: Night, run: _TaskRun) -> Worktree | _Ended:
    """The task's worktree, or how the task ends without one."""
    try:
        return night.worktrees.of(run.task)
    except BranchCheckedOut as taken:
        run.log.warning("task_skipped_branch_checked_out", at=taken.at)
        return _Ended(TaskOutcome.SKIPPED, reason=BRANCH_CHECKED_OUT)
    except Exception as failed:
        # Its git killed by the signal stopping the night (systemd's control-group kill, a moment
        # before the night's own handler runs; `git_status`: worktree_registration.with_git_status, `status`: a
        # GitCommandError): the task is cancelled, not a night crashed on a worktree git refused.
        if not died_of_the_nights_signal(run.cancel, getattr(failed, "git_status", getattr(failed, "status", None))):
            raise
        return _Ended(TaskOutcome.CANCELLED, reason=run.cancel.why)


def _recorded(night: Night, run: _TaskRun, ended: _Ended) -> _Ended:
    """`ended`, once the task's row records it."""
    night.parts.store.finish_task(
        run.task_run_id, outcome=ended.outcome.value, reason=ended.reason, commit=ended.commit, detail=ended.detail
    )
    return ended


def _finished(night: Night, run: _TaskRun, ended: _Ended) -> TaskSummary:
    """The task's end, told the night (an unreachable model, a spent budget: Night.task_ended) and the log."""
    night.task_ended(ended.reason)
    run.log.info("task_finished", outcome=ended.outcome.value, reason=ended.reason, iterations=ended.begun)
    return TaskSummary(name=run.task.name, outcome=ended.outcome, reason=ended.reason, commit=ended.commit, iterations=ended.reports)


def _ended_earlier(night: Night, run: _TaskRun) -> _Ended | None:
    """How the task ends without work because this scheduled night's earlier runs ended it, or None."""
    if run.work_key in night.earlier.succeeded:
        # Its commit, recorded again: the morning's report reads this run, and there is the work to review.
        commit = night.earlier.succeeded[run.work_key]
        run.log.info("task_skipped_done_earlier_tonight", commit=commit[:12])
        return _Ended(TaskOutcome.SKIPPED, reason=DONE_EARLIER_TONIGHT, commit=commit)
    if ended := _ended_earlier_tonight(night, run.work_key):
        # Recorded as it ended there: the morning's report, the JUnit and the exit code tell the night as it was.
        run.log.info(ended.event, reason=ended.earlier_reason, iterations=night.earlier.counted(run.work_key))
        return _Ended(ended.outcome, reason=ended.reason)
    return None


def _refused(night: Night, run: _TaskRun) -> _Ended | None:
    """The task cancelled because it may not begin now (night.why_not_start_iteration, or its own budget spent), or None."""
    if refused := night.why_not_start_iteration() or _spent((night.task_budget(run.work_key),)):
        return _Ended(TaskOutcome.CANCELLED, reason=refused)
    return None


def _done_elsewhere(night: Night, run: _TaskRun) -> _Ended | None:
    """The task skipped if another worker sharing the store finished it tonight (the work is not done twice), or None."""
    if done_by := night.done_elsewhere(run.work_key):
        run.log.info("task_skipped_done_elsewhere", host=done_by)
        return _Ended(TaskOutcome.SKIPPED, reason=DONE_ELSEWHERE)
    return None


def _taken_again(night: Night, run: _TaskRun) -> _Ended | None:
    """A set-aside task that now holds its lease: its row running again, then skipped if done elsewhere, or
    refused (asked once the lease is free: the wait may have used the time left, see Night.why_stop_waiting)."""
    night.parts.store.resume_task(run.task_run_id)
    return _done_elsewhere(night, run) or _refused(night, run)


def _wait_for_lease(night: Night, waiting: _Waiting, *, first: bool) -> TaskSummary | _SetAside:
    """The task queued again to wait for the lease another live worker holds (it may finish the task, or
    die and leave it to this night), holding neither the lease nor a slot meanwhile; recorded now instead
    (_stopped_waiting) when the night stops waiting or takes no more work. `first`: the task's first wait."""
    run = waiting.run
    if not night.why_stop_waiting():
        if first:
            # Its row says why it is not being worked: `running`, reason `leased`, until it is or the night stops.
            night.parts.store.wait_task_for_lease(run.task_run_id)
            run.log.info("task_waiting_for_lease", holder=waiting.holder)
        if (next_try := night.set_aside(functools.partial(_try_again, night, waiting))) is not None:
            return _SetAside(next_try)
    return _finished(night, run, _recorded(night, run, _stopped_waiting(night, waiting)))


def _stopped_waiting(night: Night, waiting: _Waiting) -> _Ended:
    """How a task is recorded when the night stops waiting for its lease: `done_elsewhere` if the holder
    finished it meanwhile (it records that before letting the lease go, so perhaps within this wait's last
    pause), else `skipped`, `leased`. Asked only of tasks found leased: other nights ask nothing more."""
    return _done_elsewhere(night, waiting.run) or _leased(waiting)


def _leased(waiting: _Waiting) -> _Ended:
    """A task recorded `skipped`, `leased`: the night stopped waiting while another worker held its lease."""
    waiting.run.log.info("task_skipped_leased", holder=waiting.holder)
    return _Ended(TaskOutcome.SKIPPED, reason="leased")


@dataclass(frozen=True)
class _EndedEarlier:
    """How this scheduled night's earlier runs left a task it will not work again."""

    outcome: TaskOutcome
    reason: str  # recorded for this run's task
    event: str  # the log event that says so
    earlier_reason: str  # why its work ended there


def _ended_earlier_tonight(night: Night, work_key: str) -> _EndedEarlier | None:
    """A task this scheduled night's earlier runs parked or left no iterations to, or None: a task
    they paused, cancelled or saw interrupted is worked again with the iterations it has left, and one
    that another worker sharing the store has finished since goes on to be recorded `done_elsewhere`."""
    outcome, reason = night.earlier.ended.get(work_key, ("", ""))
    if outcome == TaskOutcome.PARKED.value:
        ended = _EndedEarlier(TaskOutcome.PARKED, reason=PARKED_EARLIER_TONIGHT, event="task_skipped_parked_earlier_tonight", earlier_reason=reason)
    elif night.earlier.counted(work_key) >= night.parts.config.night.max_iterations:
        ended = _EndedEarlier(TaskOutcome.FAILED, reason=FAILED_EARLIER_TONIGHT, event="task_skipped_failed_earlier_tonight", earlier_reason=reason)
    else:
        return None
    return None if night.done_elsewhere(work_key) else ended


def _iterate(night: Night, task: TaskConfig, setup: TaskSetup, *, first_asked: datetime, work_key: str) -> _Ended:
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
            if refused := night.why_not_start_iteration() or _spent(setup.budgets):
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
    return _Ended(outcome, reason=reason, commit=commit, reports=tuple(reports), begun=begun, detail=detail)


def _task_setup(night: Night, run: _TaskRun, workspace: Worktree, model: Model, *, lease: LeaseKeeper) -> TaskSetup:
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


def _spent(budgets: Sequence[TokenBudget]) -> str:
    """Why a budget allows no further iteration (the response that crossed it was acted on), or ""."""
    return next((budget.why for budget in budgets if budget.exhausted), "")


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
