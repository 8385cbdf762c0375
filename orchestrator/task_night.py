"""One task's night: its row, its tries under its lease, and how it ends.

The night (orchestrator/night.py) submits `run_task` for each task to its pool and follows each task's
futures to its summary (`summary_of`). A task whose lease another live worker holds is set aside: its
later tries are submitted to the same pool (`Night.set_aside`) until the lease is free or the night
stops waiting. Here are those tries, in outline; how a task ends without work is ended_without_work.py's,
its work under the lease (worktree and iterations) task_work.py's. These modules use the public surface of
`Night` (orchestrator/night_state.py) only; the night imports them, not the reverse.
"""

from __future__ import annotations

import contextlib
import functools
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

from orchestrator.config import TaskConfig
from orchestrator.ended_without_work import done_elsewhere, ended_earlier, leased, refused, refused_unless_elsewhere
from orchestrator.leases import DEFAULT_TTL_S, LeaseHeld, LeaseKeeper, new_owner
from orchestrator.records import IterationReport, TaskOutcome
from orchestrator.task_branches import branch_for
from orchestrator.task_records import TaskEnded, TaskInNight
from orchestrator.task_work import worked

if TYPE_CHECKING:
    from orchestrator.night_state import Night

# How often a task set aside for a lease another live worker holds asks for it again: a quarter of the
# holder's heartbeat (ttl/3), so a lease let go is taken up within seconds, at a few short statements per waiting
# task (the run's heartbeat, whether the work was done elsewhere, the lease asked for).
LEASE_POLL_S = DEFAULT_TTL_S / 12


@dataclass(frozen=True)
class TaskSummary:
    name: str
    outcome: TaskOutcome
    reason: str
    commit: str
    iterations: tuple[IterationReport, ...]


@dataclass(frozen=True)
class _Waiting:
    """A set-aside task between its tries: its run, the lease's holder, and when it last asked."""

    run: TaskInNight
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
    if ended := ended_earlier(night, run) or refused_unless_elsewhere(night, run):
        return _finished(night, run, _recorded(night, run, ended))
    try:
        return _under_lease(night, run, taken=_taken_first)
    except LeaseHeld as held:
        # The store asked before the first wait, as at each later try: a holder killed between recording the
        # task done and letting its lease go would cost a LEASE_POLL_S for nothing.
        if ended := done_elsewhere(night, run):
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
    if ended := (
        ended_earlier(night, run) or done_elsewhere(night, run) or (leased(run, waiting.holder) if night.why_stop_waiting() else None)
    ):
        return _finished(night, run, _recorded(night, run, ended))
    try:
        return _under_lease(night, run, taken=_taken_again)
    except LeaseHeld as held:
        return _wait_for_lease(night, _Waiting(run, str(held), time.monotonic()), first=False)


def _begin(night: Night, task: TaskConfig) -> TaskInNight:
    """The task's row, recorded even when it cannot start (deadline, budget, signal): the morning's report
    and the CI's test cases list every task of the night, not only those that began."""
    work_key, store = night.work_key(task), night.parts.store
    task_run_id = store.begin_task(night.run_id, name=task.name, branch=branch_for(task.name), work_key=work_key, position=night.position(task))
    log = night.log.bind(task=task.name, task_run_id=task_run_id)
    night.worktrees.task_began(task, log)
    return TaskInNight(task, work_key, task_run_id, log, cancel=night.parts.cancel.child())


def _under_lease(night: Night, run: TaskInNight, *, taken: Callable[[Night, TaskInNight], TaskEnded | None]) -> TaskSummary:
    """The task ended under its lease: as `taken` says once the lease is held, else worked; its end recorded
    before the lease is let go, so a worker that takes it next sees the task done. Raises LeaseHeld while
    another live worker holds the lease."""
    owner, store = new_owner(night.state_id), night.parts.store
    lease = LeaseKeeper(store, night.lease_key(run.task), owner=owner, on_lost=lambda: run.cancel.cancel("lease_lost"), log=run.log)
    with lease:
        ended = _recorded(night, run, taken(night, run) or worked(night, run, lease))
    return _finished(night, run, ended)


def _recorded(night: Night, run: TaskInNight, ended: TaskEnded) -> TaskEnded:
    """`ended`, once the task's row records it."""
    night.parts.store.finish_task(
        run.task_run_id, outcome=ended.outcome.value, reason=ended.reason, commit=ended.commit, detail=ended.detail
    )
    return ended


def _finished(night: Night, run: TaskInNight, ended: TaskEnded) -> TaskSummary:
    """The task's end, told the night (an unreachable model, a spent budget: Night.task_ended) and the log; its
    token let go of the night's (a first call still out holds it on until that call ends: ahead.py)."""
    run.cancel.release()
    night.task_ended(ended.reason)
    run.log.info("task_finished", outcome=ended.outcome.value, reason=ended.reason, iterations=ended.begun)
    return TaskSummary(name=run.task.name, outcome=ended.outcome, reason=ended.reason, commit=ended.commit, iterations=ended.reports)


def _taken_first(night: Night, run: TaskInNight) -> TaskEnded | None:
    """A task that took its lease on its first try: skipped if done elsewhere, or refused (asked again: a held task
    the night could still wait for passed the first refusal, and its lease may have come free since)."""
    return done_elsewhere(night, run) or refused(night, run)


def _taken_again(night: Night, run: TaskInNight) -> TaskEnded | None:
    """A set-aside task that now holds its lease: its row running again, then skipped if done elsewhere, or
    refused (asked once the lease is free: the wait may have used the time left, see Night.why_stop_waiting)."""
    night.parts.store.resume_task(run.task_run_id)
    return _taken_first(night, run)


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


def _stopped_waiting(night: Night, waiting: _Waiting) -> TaskEnded:
    """How a task is recorded when the night stops waiting for its lease: `done_elsewhere` if the holder
    finished it meanwhile (it records that before letting the lease go, so perhaps within this wait's last
    pause), else `skipped`, `leased`. Asked only of tasks found leased: other nights ask nothing more."""
    return done_elsewhere(night, waiting.run) or leased(waiting.run, waiting.holder)
