"""What other runs did with a work (TaskRun.work_key): the queries a night asks before it works a task.

`succeeded_elsewhere_query`: whether another worker (a state dir sharing the store) finished the work with
success since a moment; a night asks it of each task, and again while one waits for a lease, and a dead
night's recovery of a task that waited. `read_earlier_tonight`: what the state dir's runs begun since a
scheduled night's fire time did with each work, which a night `serve` started again goes on from.

Both take times on the store's clock (RunStore shifts this host's onto it).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from runs.event_rows import MODEL_CALL
from runs.models import Event, Iteration, Run, TaskRun
from runs.views import EarlierTonight


def succeeded_elsewhere_query(work_key: str, run_id: int, *, since: datetime | None = None) -> Any:
    """The hosts of the runs other than `run_id` that finished the work `work_key` with success since `since` (the
    store's clock), or, without one, since run `run_id` began: at most one row (see RunStore.succeeded_elsewhere).

    Finished with success: the task run says `succeeded`, or one of its iterations committed since then. A worker
    that dies (or whose night an error ends) after an iteration committed has let its lease go, or has it lapse,
    with its task still `running`; its own recovery makes that task `succeeded`, but the worker waiting for the
    lease would meanwhile work the task a second time."""
    began: Any = since if since is not None else select(Run.started_at).where(Run.id == run_id).scalar_subquery()
    committed = (
        select(Iteration.id)
        .where(Iteration.task_run_id == TaskRun.id, Iteration.outcome == "committed", Iteration.finished_at >= began)
        .exists()
    )
    return (
        select(Run.host)
        .join(TaskRun, TaskRun.run_id == Run.id)
        .where(
            TaskRun.work_key == work_key,
            TaskRun.run_id != run_id,
            or_((TaskRun.outcome == "succeeded") & (TaskRun.finished_at >= began), committed),
        )
        .limit(1)
    )


def read_earlier_tonight(session: Session, state_id: str, since: datetime, run_id: int) -> EarlierTonight:
    """What state dir `state_id`'s runs other than `run_id` begun at or after `since` (the store's clock) did, by
    work key: see RunStore.earlier_tonight."""
    began = select(Run.id).where(Run.state_id == state_id, Run.id != run_id, Run.started_at >= since)
    keyed = (TaskRun.run_id.in_(began), TaskRun.work_key.is_not(None))
    done = select(TaskRun.work_key, TaskRun.commit).where(*keyed, TaskRun.outcome == "succeeded").order_by(TaskRun.id)
    # Not the model's doing, so not counted: a killed process's, one stopped on purpose, one the
    # model never answered (still `running`: its dead process's, not yet recovered), one ended by
    # an error of overnight's or its environment's (a full disk, a failing store).
    uncounted = or_(
        Iteration.outcome.in_(("interrupted", "cancelled", "running")), Iteration.reason.in_(("model_unreachable", "iteration_error"))
    )
    used = (
        select(TaskRun.work_key, func.sum(Iteration.tokens), func.max(Iteration.number))
        .join(Iteration, Iteration.task_run_id == TaskRun.id)
        .where(*keyed)
        .group_by(TaskRun.work_key)
    )
    each_counted = (
        select(TaskRun.work_key, Iteration.outcome, Iteration.reason)
        .join(Iteration, Iteration.task_run_id == TaskRun.id)
        .where(*keyed, ~uncounted)
        .order_by(Iteration.id)
    )
    # First answers no iteration took: spent on the night, not on a task's iterations (see TaskRun.unused_tokens).
    unused = select(func.coalesce(func.sum(TaskRun.unused_tokens), 0)).where(*keyed)
    worked = select(Iteration.id).where(Iteration.task_run_id == TaskRun.id).exists()
    last = select(TaskRun.work_key, TaskRun.outcome, TaskRun.reason).where(*keyed, worked).order_by(TaskRun.id)
    # An iteration ended early ran at least until it was last seen working: an `interrupted` one's end is its last
    # heartbeat (its last model call), not when recovery found it; a `cancelled` one's (a restart's SIGTERM) is taken
    # at its last model call too, not at the cancel, which may come after hours of waiting for a model server that
    # went down, or of a process stopped or a host asleep. Not one the model never answered: its time is the
    # endpoint's retries and timeouts, which the night running it does not count either (Night.iteration_took). One
    # such wait, 40 minutes, refused every task of the night begun again once the server was back.
    last_answer = (
        select(func.max(Event.at)).where(Event.iteration_id == Iteration.id, Event.type == MODEL_CALL).scalar_subquery()
    )
    timed = (
        select(Iteration.started_at, Iteration.finished_at, Iteration.outcome, last_answer)
        .join(TaskRun, Iteration.task_run_id == TaskRun.id)
        .where(
            *keyed, Iteration.finished_at.is_not(None), Iteration.outcome != "running", Iteration.reason != "model_unreachable"
        )
    )
    succeeded = {name: commit for name, commit in session.execute(done)}
    tokens, last_number = {}, {}
    for name, total, highest in session.execute(used):
        tokens[name], last_number[name] = int(total or 0), int(highest or 0)
    unused_tokens = int(session.scalar(unused) or 0)
    ended = {name: (outcome, reason) for name, outcome, reason in session.execute(last)}
    endings: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for name, outcome, reason in session.execute(each_counted):
        endings[name].append((outcome, reason or ""))
    return EarlierTonight(
        succeeded=succeeded,
        tokens=tokens,
        unused_tokens=unused_tokens,
        last_number=last_number,
        ended=ended,
        endings={name: tuple(seen) for name, seen in endings.items()},
        slowest_iteration_s=max((_ran_for(*row) for row in session.execute(timed)), default=0.0),
    )


def _ran_for(started: datetime, finished: datetime, outcome: str, last_answer: datetime | None) -> float:
    """Seconds an ended iteration ran, as `read_earlier_tonight` counts them."""
    ended = (last_answer or started) if outcome == "cancelled" else finished
    return (ended - started).total_seconds()
