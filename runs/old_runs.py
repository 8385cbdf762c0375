"""`[state] keep_runs_days`: which of a state dir's runs are old enough to go, and their removal with every row of theirs.

A run goes with its task runs, their iterations and those iterations' events, in the caller's
transaction: a batch is removed whole or not at all. Leases (no run owns one) and the scheduler's
job table are never touched, nor another state dir's runs, nor runs recorded before state dirs had
names (whose they are cannot be told in a store machines share).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, delete, func, select

from runs.models import Event, Iteration, Run, TaskRun

# Runs removed in one transaction: a night's events are a few thousand rows, and SQLite lets no
# other writer in (a `report` reads on) while a batch is deleted.
RUNS_PER_BATCH = 20

# An owed notes.md entry is told written or not by counting alike iterations that ended in the same
# minute (RunStore.notes_written_alike): runs that ended that close to an owing run's start are kept.
_NOTE_HEADER_MINUTE = timedelta(minutes=1)


def remove_a_batch(connection: Connection, state_id: str, *, ended_before: datetime, begun_before: datetime | None) -> int:
    """Remove up to RUNS_PER_BATCH runs of state dir `state_id` that ended before `ended_before` (and began before
    `begun_before`, when given), oldest first, with all their rows; returns how many runs went.

    Never a run still `running`, one with a task or iteration still `running` (recovery's to settle), or one that
    ended after the earliest run of this state dir that still owes a notes.md entry began (recovery writes it from them).
    """
    owing_since = connection.execute(_earliest_owing_run(state_id)).scalar()
    if owing_since is not None:
        ended_before = min(ended_before, owing_since - _NOTE_HEADER_MINUTE)
    run_ids = list(connection.execute(_removable(state_id, ended_before, begun_before)).scalars())
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


def _removable(state_id: str, ended_before: datetime, begun_before: datetime | None) -> Any:
    """The ids of the next batch of the state dir's ended runs that `remove_a_batch` may remove."""
    unsettled_task = select(TaskRun.id).where(TaskRun.run_id == Run.id, TaskRun.outcome == "running").exists()
    unsettled_iteration = (
        select(Iteration.id)
        .join(TaskRun, Iteration.task_run_id == TaskRun.id)
        .where(TaskRun.run_id == Run.id, Iteration.outcome == "running")
        .exists()
    )
    query = select(Run.id).where(
        Run.state_id == state_id,
        Run.status != "running",
        Run.finished_at < ended_before,
        ~unsettled_task,
        ~unsettled_iteration,
    )
    if begun_before is not None:
        query = query.where(Run.started_at < begun_before)
    return query.order_by(Run.id).limit(RUNS_PER_BATCH)
