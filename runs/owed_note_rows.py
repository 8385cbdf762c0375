"""The notes.md entries the store says are owed: an iteration's ending recorded first, its entry written after.

An iteration that ends with a note is recorded with `note_owed` (RunWrites.finish_iteration), and marked once
notes.md has its entry (`note_written`). A night that died between the two leaves the entry owed: the next one
writes it (`owed_notes`), unless notes.md already has an entry whose header reads the same (`notes_written_alike`).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select

from runs.models import Iteration, Run, TaskRun
from runs.store_transactions import StoreTransactions
from runs.views import IterationView
from runs.views_from_rows import iteration_views


class OwedNoteRows(StoreTransactions):
    """RunStore's record of the notes.md entries owed and written."""

    def owed_notes(self, state_id: str | None) -> list[IterationView]:
        """Iterations of state dir `state_id`'s ended runs whose notes.md entry is still owed, oldest first
        (a run still `running` may be a live copy of the state dir elsewhere: its notes are its own)."""
        if state_id is None:
            return []
        query = (
            select(Iteration, TaskRun.name)
            .join(TaskRun, Iteration.task_run_id == TaskRun.id)
            .join(Run, TaskRun.run_id == Run.id)
            .where(Iteration.note_owed.is_(True), Run.state_id == state_id, Run.status != "running")
            .order_by(Iteration.id)
        )
        with self._reading() as session:
            return iteration_views(session, session.execute(query).all())

    def notes_written_alike(self, state_id: str, task: str, number: int, reason: str, start: datetime, end: datetime) -> int:
        """How many iterations of state dir `state_id` named `task` and numbered `number` that ended for `reason`
        in [start, end) have their notes.md entry written: entries whose header reads the same."""
        query = (
            select(func.count())
            .select_from(Iteration)
            .join(TaskRun, Iteration.task_run_id == TaskRun.id)
            .join(Run, TaskRun.run_id == Run.id)
            .where(
                Iteration.note_owed.is_(False), Run.state_id == state_id, TaskRun.name == task, Iteration.number == number,
                Iteration.reason == reason, Iteration.finished_at >= start, Iteration.finished_at < end,
            )
        )
        with self._reading() as session:
            return int(session.execute(query).scalar_one())

    def note_written(self, iteration_id: int) -> None:
        self._update("note_written", Iteration, iteration_id, after_events=False, note_owed=False)
