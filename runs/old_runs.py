"""`[state] keep_runs_days`: which of a state dir's runs are old enough to go, and their removal with every row of theirs.

A run goes with its task runs, their iterations and those iterations' events, in the caller's
transaction: a batch is removed whole or not at all. Leases (no run owns one) and the scheduler's
job table are never touched, nor another state dir's runs.

Runs recorded before state dirs had names (no `state_id`) are the state dir's only in its own store
(`shared=False`: the SQLite file in the state dir) while no other state dir's run is in it; in a
store machines share, whose they are cannot be told, and they stay.

In a store machines share, the newest run that finished each work with success stays too: whether
another worker finished a work since a given moment (runs.work_of_other_runs.succeeded_elsewhere_query,
which the recovery of a night dead for weeks asks) is whether the newest such finish is that late, so that
run alone answers as all of them would.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, delete, func, or_, select, union_all

from runs.models import Event, Iteration, Run, TaskRun

# Runs removed in one transaction: a night's events are a few thousand rows, and SQLite lets no
# other writer in (a `report` reads on) while a batch is deleted.
RUNS_PER_BATCH = 20

# An owed notes.md entry is told written or not by counting alike iterations that ended in the same
# minute (RunStore.notes_written_alike): runs that ended that close to an owing run's start are kept.
_NOTE_HEADER_MINUTE = timedelta(minutes=1)


def remove_a_batch(
    connection: Connection, state_id: str, *, ended_before: datetime, begun_before: datetime | None, shared: bool = True
) -> int:
    """Remove up to RUNS_PER_BATCH runs of state dir `state_id` that ended before `ended_before` (and began before
    `begun_before`, when given), oldest first, with all their rows; returns how many runs went.

    Never a run still `running`, one with a task or iteration still `running` (recovery's to settle), one that
    ended after the earliest run of this state dir that still owes a notes.md entry began (recovery writes it from them),
    nor, in a `shared` store (one other state dirs may use), one holding the newest finish with success of a work. In
    the state dir's own (not `shared`), its runs are also those with no state dir's name, while no other's is there.
    """
    owing_since = connection.execute(_earliest_owing_run(state_id)).scalar()
    if owing_since is not None:
        ended_before = min(ended_before, owing_since - _NOTE_HEADER_MINUTE)
    run_ids = list(connection.execute(_removable(state_id, ended_before, begun_before, shared)).scalars())
    if not run_ids:
        return 0
    task_runs = select(TaskRun.id).where(TaskRun.run_id.in_(run_ids))
    iterations = select(Iteration.id).where(Iteration.task_run_id.in_(task_runs))
    # Children first: the foreign keys (enforced on SQLite and PostgreSQL alike) refuse an orphan.
    connection.execute(delete(Event).where(Event.iteration_id.in_(iterations)))
    connection.execute(delete(Iteration).where(Iteration.task_run_id.in_(task_runs)))
    connection.execute(delete(TaskRun).where(TaskRun.run_id.in_(run_ids)))
    return int(connection.execute(delete(Run).where(Run.id.in_(run_ids))).rowcount or 0)


def _earliest_owing_run(state_id: str) -> Any:
    """When the earliest run of the state dir with an iteration whose notes.md entry is still owed began."""
    return (
        select(func.min(Run.started_at))
        .join(TaskRun, TaskRun.run_id == Run.id)
        .join(Iteration, Iteration.task_run_id == TaskRun.id)
        .where(Run.state_id == state_id, Iteration.note_owed.is_(True))
    )


def _of_this_state_dir(state_id: str) -> Any:
    """A run of the state dir, in its own store: one that carries its name, or, while no run carries another's, one
    an older version recorded with none (an older version's night writing there ran in this state dir)."""
    another_state_dir = select(Run.id).where(Run.state_id.is_not(None), Run.state_id != state_id).exists()
    return or_(Run.state_id == state_id, Run.state_id.is_(None) & ~another_state_dir)


def _newest_work_done() -> Any:
    """The ids of the runs holding, for each work (TaskRun.work_key), its newest finish with success, as
    runs.work_of_other_runs.succeeded_elsewhere_query tells one: a task run `succeeded` when it ended, an
    iteration `committed` when it did. A tie keeps both."""
    keyed = TaskRun.work_key.is_not(None)
    succeeded = select(TaskRun.work_key, TaskRun.run_id, TaskRun.finished_at.label("at")).where(keyed, TaskRun.outcome == "succeeded")
    committed = (
        select(TaskRun.work_key, TaskRun.run_id, Iteration.finished_at.label("at"))
        .join(Iteration, Iteration.task_run_id == TaskRun.id)
        .where(keyed, Iteration.outcome == "committed")
    )
    done = union_all(succeeded, committed).subquery()
    newest = select(done.c.work_key, func.max(done.c.at).label("at")).group_by(done.c.work_key).subquery()
    return select(done.c.run_id).join(newest, (done.c.work_key == newest.c.work_key) & (done.c.at == newest.c.at))


def _removable(state_id: str, ended_before: datetime, begun_before: datetime | None, shared: bool) -> Any:
    """The ids of the next batch of the state dir's ended runs that `remove_a_batch` may remove."""
    unsettled_task = select(TaskRun.id).where(TaskRun.run_id == Run.id, TaskRun.outcome == "running").exists()
    unsettled_iteration = (
        select(Iteration.id)
        .join(TaskRun, Iteration.task_run_id == TaskRun.id)
        .where(TaskRun.run_id == Run.id, Iteration.outcome == "running")
        .exists()
    )
    query = select(Run.id).where(
        Run.state_id == state_id if shared else _of_this_state_dir(state_id),
        Run.status != "running",
        Run.finished_at < ended_before,
        ~unsettled_task,
        ~unsettled_iteration,
    )
    if begun_before is not None:
        query = query.where(Run.started_at < begun_before)
    if shared:
        query = query.where(Run.id.not_in(_newest_work_done()))
    return query.order_by(Run.id).limit(RUNS_PER_BATCH)
