"""What recovery reads and writes of a dead night: its runs and iterations still marked running, closed.

A night killed mid-run leaves its run, task runs and iterations `running`. Recovery finds them (`running_runs`,
`running_iterations`), ends each iteration `interrupted` with the turns and tokens its model-call events count
(`interrupt_iteration`), and closes the run `crashed` (`close_interrupted_run`): each open task succeeded if an
iteration committed, else failed `interrupted`; a task set aside for a lease skipped; if asked, the tasks it never
began cancelled. A task closed failed whose iteration recovery then finds committed succeeds (`succeed_interrupted_task`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from runs.event_rows import MODEL_CALL
from runs.models import Event, Iteration, Run, TaskRun, utc_now
from runs.store_transactions import StoreTransactions
from runs.views import IterationView, RunView
from runs.views_from_rows import iteration_views, run_header, run_view
from runs.work_of_other_runs import succeeded_elsewhere_query


class RecoveryRows(StoreTransactions):
    """RunStore's part in the recovery of dead nights."""

    def running_runs(self) -> list[RunView]:
        """Runs still marked running: in progress, or left behind by a process that died."""
        with self._reading() as session:
            runs = session.scalars(select(Run).where(Run.status == "running").order_by(Run.id)).all()
            return [run_view(session, run) for run in runs]

    def run_of_task_run(self, task_run_id: int) -> RunView:
        """The run a task run belongs to (without its tasks): who owned it, on which host."""
        with self._reading() as session:
            return run_header(session.get(Run, session.get(TaskRun, task_run_id).run_id))

    def running_iterations(self) -> list[IterationView]:
        """Iterations still marked running, oldest first: in progress, or orphaned by a crash."""
        query = (
            select(Iteration, TaskRun.name)
            .join(TaskRun, Iteration.task_run_id == TaskRun.id)
            .where(Iteration.outcome == "running")
            .order_by(Iteration.id)
        )
        with self._reading() as session:
            return iteration_views(session, session.execute(query).all())


    def interrupt_iteration(self, iteration_id: int, *, correction: str) -> bool:
        """Mark a still-running iteration `interrupted`; False if it had already ended.

        Its process died before it could count its turns and tokens: they come from its
        model-call events, and its end is its last heartbeat (when it was last seen alive),
        not the moment recovery found it, which may be the next night.
        """
        calls = select(func.count()).where(Event.iteration_id == Iteration.id, Event.type == MODEL_CALL).scalar_subquery()
        tokens = (
            select(func.coalesce(func.sum(Event.prompt_tokens + Event.completion_tokens), 0))
            .where(Event.iteration_id == Iteration.id, Event.type == MODEL_CALL)
            .scalar_subquery()
        )
        with self._statements("interrupt_iteration") as connection:
            statement = (
                update(Iteration)
                .where(Iteration.id == iteration_id, Iteration.outcome == "running")
                .values(
                    outcome="interrupted", reason="interrupted", correction=correction,
                    turns=calls, tokens=tokens, finished_at=Iteration.heartbeat_at,
                )
            )
            return connection.execute(statement).rowcount == 1

    def succeed_interrupted_task(self, task_run_id: int, commit: str) -> None:
        """A task its dead run closed as failed (`interrupted`) while an iteration's end was still unrecorded,
        that iteration found committed by recovery: the task succeeded, with the commit."""
        with self._writing("succeed_interrupted_task") as session:
            session.execute(
                update(TaskRun)
                .where(TaskRun.id == task_run_id, TaskRun.outcome == "failed", TaskRun.reason == "interrupted")
                .values(outcome="succeeded", reason="", commit=commit)
            )

    def close_interrupted_run(self, run_id: int, exit_code: int | None = None, *, never_begun_reason: str = "") -> list[str]:
        """End a dead run: open task runs become succeeded (if an iteration committed) or failed/interrupted; the run `crashed`.

        `exit_code`: the code its process left with, when known (None when found dead by
        recovery: the run then ends when it was last seen alive, not when it was found).
        A failed task's reason is `interrupted`, whatever its last iteration's: the night died under it
        (killed, or an error not the task's own), which JUnit tells as an error, not the task's failure.
        `never_begun_reason`: given, the tasks the run queued and never began (it died first) are
        recorded `cancelled` with it and no iterations, as a night records the tasks it stops before
        they begin; returns their names.
        """
        with self._writing("close_interrupted_run") as session:
            now = self.now() if exit_code is not None else self._last_seen_alive(session, run_id)
            # The run claimed first, by the one closing that finds it still running: two recoveries of one run at
            # once (machines sharing a PostgreSQL store) would otherwise both read its never-begun tasks as missing
            # and both record them. The claim's row lock makes the second wait, then find the run closed.
            claimed = session.execute(
                update(Run)
                .where(Run.id == run_id, Run.status == "running")
                .values(status="crashed", finished_at=now, exit_code=exit_code)
            ).rowcount == 1
            never_begun = self._never_begun(session, run_id) if never_begun_reason and claimed else []
            for position, queued in never_begun:
                session.add(TaskRun(
                    run_id=run_id, name=queued["name"], branch=queued["branch"], work_key=queued.get("work_key"), position=position,
                    outcome="cancelled", reason=never_begun_reason, commit="", started_at=now, finished_at=now,
                ))
            open_tasks = session.scalars(select(TaskRun).where(TaskRun.run_id == run_id, TaskRun.outcome == "running")).all()
            for task in open_tasks:
                if task.reason == "leased":
                    # Set aside for another worker's lease, never worked (RunStore.wait_task_for_lease): recorded as a
                    # night stopped while it waited records it, not as work the night died under; and, as that night
                    # would, `done_elsewhere` when the holder (or another worker) has finished the work since the run
                    # began (`leased` told the morning that nobody had).
                    task.outcome, task.finished_at = "skipped", now
                    if task.work_key and session.execute(succeeded_elsewhere_query(task.work_key, run_id)).first() is not None:
                        task.reason = "done_elsewhere"
                    continue
                commit = session.scalars(
                    select(Iteration.commit)
                    .where(Iteration.task_run_id == task.id, Iteration.outcome == "committed")
                    .order_by(Iteration.id.desc())
                ).first()
                # A committed iteration's commit is "" when the check passed with nothing to commit.
                task.outcome, task.reason = ("succeeded", "") if commit is not None else ("failed", "interrupted")
                task.commit, task.finished_at = commit or "", now
        return [queued["name"] for _, queued in never_begun]

    @staticmethod
    def _never_begun(session: Session, run_id: int) -> list[tuple[int, dict[str, Any]]]:
        """(position, entry) of each task the run queued and has no row of: the night died before it began them."""
        queued = session.scalar(select(Run.queued).where(Run.id == run_id)) or []
        begun = set(session.scalars(select(TaskRun.name).where(TaskRun.run_id == run_id)))
        return [(position, entry) for position, entry in enumerate(queued) if entry["name"] not in begun]

    @staticmethod
    def _last_seen_alive(session: Session, run_id: int) -> Any:
        """The latest time a dead run left in the store: an iteration's heartbeat or end, a task's start, its own
        start or heartbeat (a night whose tasks all wait for leases writes only that: `heartbeat_run`)."""
        in_run = TaskRun.run_id == run_id
        candidates = [
            session.scalar(select(func.max(Iteration.heartbeat_at)).join(TaskRun, Iteration.task_run_id == TaskRun.id).where(in_run)),
            session.scalar(select(func.max(Iteration.finished_at)).join(TaskRun, Iteration.task_run_id == TaskRun.id).where(in_run)),
            session.scalar(select(func.max(TaskRun.started_at)).where(in_run)),
            *(session.execute(select(Run.started_at, Run.heartbeat_at).where(Run.id == run_id)).first() or ()),
        ]
        return max((seen for seen in candidates if seen is not None), default=utc_now())
