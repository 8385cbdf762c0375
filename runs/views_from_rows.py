"""The run store's rows as the frozen views it hands back (runs/views.py), read in a handful of queries.

A run's view carries its tasks in the config's order and each task its iterations; an iteration's view its
signals and how many calls it made, fetched for all the iterations at once, not one query each.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any, Sequence

from sqlalchemy import func, inspect, select
from sqlalchemy.orm import Session

from orchestrator.records import Level, Signal
from runs.event_rows import MODEL_CALL, SIGNAL, TOOL_CALL
from runs.models import Event, Iteration, Run, TaskRun
from runs.views import IterationView, RunView, TaskView


def run_view(session: Session, run: Run) -> RunView:
    # The config's order; an older version's rows (no position) in the order they began.
    order = (TaskRun.position.is_(None), TaskRun.position, TaskRun.id)
    tasks = session.scalars(select(TaskRun).where(TaskRun.run_id == run.id).order_by(*order)).all()
    iterations = session.execute(
        select(Iteration, TaskRun.name)
        .join(TaskRun, Iteration.task_run_id == TaskRun.id)
        .where(TaskRun.run_id == run.id)
        .order_by(Iteration.id)
    ).all()
    by_task: dict[int, list[IterationView]] = defaultdict(list)
    for view in iteration_views(session, iterations):
        by_task[view.task_run_id].append(view)
    task_views = tuple(
        TaskView(
            id=task.id,
            name=task.name,
            branch=task.branch,
            outcome=task.outcome,
            reason=task.reason,
            commit=task.commit,
            iterations=tuple(by_task[task.id]),
            started_at=task.started_at,
            finished_at=task.finished_at,
            unused_tokens=task.unused_tokens or 0,
            detail=task.detail or "",
        )
        for task in tasks
    )
    return dataclasses.replace(run_header(run), tasks=task_views)


def run_header(run: Run) -> RunView:
    """The run's own row as a view, without its tasks."""
    return RunView(
        id=run.id,
        started_at=run.started_at,
        finished_at=run.finished_at,
        status=run.status,
        exit_code=run.exit_code,
        pid=run.pid,
        host=run.host,
        config_path=run.config_path,
        state_id=run.state_id,
        deadline=_unless_left_out(run, "deadline"),
    )


def _unless_left_out(row: Any, name: str) -> Any:
    """The row's column `name`, or None where the store lacks it and the read left it out (RunStore.read_without)."""
    return None if name in inspect(row).unloaded else getattr(row, name)


def iteration_views(session: Session, rows: Sequence[tuple[Iteration, str]]) -> list[IterationView]:
    """Views for these iterations, with signals and call counts fetched in two queries."""
    ids = [iteration.id for iteration, _ in rows]
    if not ids:
        return []
    signals: dict[int, list[Signal]] = defaultdict(list)
    signal_rows = session.execute(
        select(Event.iteration_id, Event.level, Event.name, Event.message)
        .where(Event.iteration_id.in_(ids), Event.type == SIGNAL)
        .order_by(Event.id)
    )
    for iteration_id, level, kind, message in signal_rows:
        signals[iteration_id].append(Signal(Level(level), kind, message))
    counts: dict[tuple[int, str], int] = {}
    event_tokens: dict[int, int] = defaultdict(int)
    count_rows = session.execute(
        select(Event.iteration_id, Event.type, func.count(), func.sum(Event.prompt_tokens + Event.completion_tokens))
        .where(Event.iteration_id.in_(ids), Event.type.in_((MODEL_CALL, TOOL_CALL)))
        .group_by(Event.iteration_id, Event.type)
    )
    for iteration_id, event_type, count, tokens in count_rows:
        counts[(iteration_id, event_type)] = count
        if event_type == MODEL_CALL:
            event_tokens[iteration_id] = int(tokens or 0)

    def so_far(it: Iteration) -> dict[str, int]:
        """Turns and tokens: counted at the iteration's end; until then (in flight, or its
        process died), what its model-call events say."""
        if it.outcome != "running":
            return {"turns": it.turns, "tokens": it.tokens}
        return {"turns": counts.get((it.id, MODEL_CALL), 0), "tokens": event_tokens[it.id]}

    return [
        IterationView(
            id=it.id,
            task_run_id=it.task_run_id,
            task_name=task_name,
            number=it.number,
            outcome=it.outcome,
            reason=it.reason,
            correction=it.correction,
            checkpoint=it.checkpoint,
            commit=it.commit,
            **so_far(it),
            transcript=it.transcript,
            pid=it.pid,
            started_at=it.started_at,
            finished_at=it.finished_at,
            signals=tuple(signals[it.id]),
            model_calls=counts.get((it.id, MODEL_CALL), 0),
            tool_calls=counts.get((it.id, TOOL_CALL), 0),
            heartbeat_at=it.heartbeat_at,
        )
        for it, task_name in rows
    ]
