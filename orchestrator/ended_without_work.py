"""How a task's night ends without work: done or ended by this scheduled night's earlier runs, done elsewhere, refused
a start (the night's or its own budget spent, the deadline), or left to the worker that holds its lease."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from orchestrator.cancel import TokenBudget
from orchestrator.records import DONE_EARLIER_TONIGHT, DONE_ELSEWHERE, TaskOutcome
from orchestrator.task_records import TaskEnded, TaskInNight

if TYPE_CHECKING:
    from orchestrator.night_state import Night

# A task not worked again because an earlier run of the same scheduled night spent its iterations
# on it (outcome failed), or parked it (outcome parked): a night begun again is not a second night.
FAILED_EARLIER_TONIGHT = "failed_earlier_tonight"
PARKED_EARLIER_TONIGHT = "parked_earlier_tonight"


def ended_earlier(night: Night, run: TaskInNight) -> TaskEnded | None:
    """How the task ends without work because this scheduled night's earlier runs ended it, or None."""
    if run.work_key in night.earlier.succeeded:
        # Its commit, recorded again: the morning's report reads this run, and there is the work to review.
        commit = night.earlier.succeeded[run.work_key]
        run.log.info("task_skipped_done_earlier_tonight", commit=commit[:12])
        return TaskEnded(TaskOutcome.SKIPPED, reason=DONE_EARLIER_TONIGHT, commit=commit)
    if ended := _ended_earlier_tonight(night, run.work_key):
        # Recorded as it ended there: the morning's report, the JUnit and the exit code tell the night as it was.
        run.log.info(ended.event, reason=ended.earlier_reason, iterations=night.earlier.counted(run.work_key))
        return TaskEnded(ended.outcome, reason=ended.reason)
    return None


def refused(night: Night, run: TaskInNight) -> TaskEnded | None:
    """The task cancelled because it may not begin now (night.why_not_start_iteration, or its own budget spent), or None."""
    if why := night.why_not_start_iteration() or spent((night.task_budget(run.work_key),)):
        return TaskEnded(TaskOutcome.CANCELLED, reason=why)
    return None


def refused_unless_elsewhere(night: Night, run: TaskInNight) -> TaskEnded | None:
    """A task not yet begun, refused a start (`refused`): recorded as another worker's if one finished it tonight
    (`done_elsewhere`) or holds its lease now (`leased`), as a task that waited for the lease is when the night
    stops; else `cancelled`. The morning's report (the deadline's "not started", the exit code) tells what this night
    left undone, not work another worker had. Asked only of a task refused: other tasks ask nothing more.
    None too for a held task the night may still wait for (Night.why_stop_waiting: refused only as its slowest
    iteration could not finish by the deadline, or for its own budget): it waits for the lease as any held task does,
    and is `done_elsewhere` if its holder finishes it before the night stops, `cancelled` if the lease comes free."""
    if (ended := refused(night, run)) is None:
        return None
    if elsewhere := done_elsewhere(night, run):
        return elsewhere
    if not (holder := night.lease_held_elsewhere(run.task)):
        return ended
    return leased(run, holder) if night.why_stop_waiting() else None


def done_elsewhere(night: Night, run: TaskInNight) -> TaskEnded | None:
    """The task skipped if another worker sharing the store finished it tonight (the work is not done twice), or None."""
    if done_by := night.done_elsewhere(run.work_key):
        run.log.info("task_skipped_done_elsewhere", host=done_by)
        return TaskEnded(TaskOutcome.SKIPPED, reason=DONE_ELSEWHERE)
    return None


def leased(run: TaskInNight, holder: str) -> TaskEnded:
    """A task recorded `skipped`, `leased`: the night stopped waiting while another worker (`holder`) held its lease."""
    run.log.info("task_skipped_leased", holder=holder)
    return TaskEnded(TaskOutcome.SKIPPED, reason="leased")


def spent(budgets: Sequence[TokenBudget]) -> str:
    """Why a budget allows no further iteration (the response that crossed it was acted on), or ""."""
    return next((budget.why for budget in budgets if budget.exhausted), "")


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
