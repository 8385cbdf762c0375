"""What the store reads back about runs: a run for the report, a task's iterations, and what other runs did with a work.

Each read first waits for the queued events (runs/store_transactions.py), and hands back runs/views.py's frozen views.
Times asked of other runs' work are this host's, shifted onto the store's clock (runs/work_of_other_runs.py's queries).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from orchestrator.errors import StateError
from runs.engine import database_complaint
from runs.models import Iteration, Run, TaskRun
from runs.store_transactions import StoreTransactions
from runs.views import EarlierTonight, IterationView, RunView
from runs.views_from_rows import iteration_views, run_view
from runs.work_of_other_runs import read_earlier_tonight, succeeded_elsewhere_query


class RunReads(StoreTransactions):
    """RunStore's reads of runs and their iterations, and of the work other runs did."""

    def latest_run(self, *, state_id: str | None = "") -> RunView | None:
        """The most recently begun run, fully loaded.

        With `state_id`, the latest of that state dir's runs, or, while it has none, of runs
        recorded before state dirs had names (its own, from before an upgrade; in a store
        machines share, an older version's unnamed runs are any machine's, so once this state
        dir has a run of its own they are not taken for it); `None`: only such older runs. The
        default, "", means any run.
        """
        # Ids grow with every insert on every backend, unlike clocks that can step back.
        latest = select(Run).order_by(Run.id.desc()).limit(1)
        with self._reading() as session:
            if state_id == "":
                run = session.scalars(latest).first()
            else:
                run = session.scalars(latest.where(Run.state_id == state_id)).first() if state_id else None
                # `== None` is SQL's IS NULL: the older runs.
                run = run or session.scalars(latest.where(Run.state_id.is_(None))).first()
            return run_view(session, run) if run is not None else None

    def run(self, run_id: int) -> RunView | None:
        with self._reading() as session:
            run = session.get(Run, run_id)
            return run_view(session, run) if run is not None else None


    def iterations_for_task(self, name: str, limit: int = 20) -> list[IterationView]:
        """The task's iterations across all runs, most recent first."""
        query = (
            select(Iteration, TaskRun.name)
            .join(TaskRun, Iteration.task_run_id == TaskRun.id)
            .where(TaskRun.name == name)
            .order_by(Iteration.id.desc())
            .limit(limit)
        )
        with self._reading() as session:
            return iteration_views(session, session.execute(query).all())

    def succeeded_elsewhere(self, work_key: str, run_id: int, *, since: datetime | None = None) -> str | None:
        """The host where another worker (a state dir sharing this store) finished the same work
        (`work_key`: see TaskRun) with success since run `run_id` began, or since `since` (this host's
        clock: a scheduled night's fire time) when given, if one did."""
        query = succeeded_elsewhere_query(work_key, run_id, since=None if since is None else since + self._clock_offset)
        try:
            with self._engine.connect() as connection:  # task rows are not queued events: no flush needed
                return connection.execute(query).scalar()
        except SQLAlchemyError as exc:
            raise StateError(f"run store: reading failed: {database_complaint(exc)}") from exc

    def earlier_tonight(self, state_id: str, since: datetime, run_id: int) -> EarlierTonight:
        """What this state dir's runs other than `run_id` begun at or after `since` (this host's clock:
        a scheduled night's fire time) did, by work key (see TaskRun.work_key): the work they finished
        with success, the tokens each work's iterations used and the highest number among them, how
        each of those that count against `[night] max_iterations` ended, and how the latest task run
        that worked it ended; and how long the slowest of their ended iterations ran."""
        with self._reading() as session:
            return read_earlier_tonight(session, state_id, since + self._clock_offset, run_id)
