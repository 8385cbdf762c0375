"""The run store: what happened each night, written as it happens.

Every write commits at once in its own short session, so a crash in the
middle of the night loses at most the event in flight, and another process
(the CLI's `status`, a second night after a crash) sees it immediately.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator, Sequence

from sqlalchemy import Engine, create_engine, event, func, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.errors import StateError
from orchestrator.records import Level, Signal
from runs.models import Base, Event, Iteration, Run, TaskRun, utc_now
from runs.views import IterationView, RunView, TaskView, worst_signal

__all__ = ["RunStore", "RunView", "TaskView", "IterationView", "worst_signal"]

MODEL_CALL = "model_call"
TOOL_CALL = "tool_call"
SIGNAL = "signal"


def _one_line(exc: BaseException) -> str:
    """The database's own complaint, without SQLAlchemy's statement dump and links."""
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    return lines[0] if lines else type(cause).__name__


def _text(value: Any) -> str:
    """Enum members (Level, outcomes) and plain strings alike, stored as their value."""
    return str(getattr(value, "value", value))


def _pragmas_on_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        # WAL lets readers (the CLI) look while the night writes; NORMAL is safe under WAL.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def _create_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(parsed, pool_pre_ping=True)
    database = parsed.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        parent = Path(database).expanduser().parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            # mkdir's own message ("File exists") hides that the path is a regular file.
            raise NotADirectoryError(f"{parent} is not a directory") from None
    engine = create_engine(parsed)
    event.listen(engine, "connect", _pragmas_on_connect)
    return engine


class RunStore:
    """Runs, task runs, iterations and their events, in one SQL database."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @classmethod
    def open(cls, url: str) -> RunStore:
        """Connect and create missing tables; StateError (one line) if the store cannot be used."""
        engine: Engine | None = None
        try:
            engine = _create_engine(url)
            Base.metadata.create_all(engine)
        # ImportError: the URL names a database driver that is not installed.
        except (SQLAlchemyError, OSError, ImportError) as exc:
            if engine is not None:
                engine.dispose()
            raise StateError(f"cannot open run store {_safe(url)}: {_one_line(exc)}") from exc
        return cls(engine)

    def close(self) -> None:
        self._engine.dispose()

    @contextlib.contextmanager
    def _writing(self, action: str) -> Iterator[Session]:
        """One short transaction, committed on exit; database failures become StateError."""
        try:
            with self._sessions.begin() as session:
                yield session
        except SQLAlchemyError as exc:
            raise StateError(f"run store: {action} failed: {_one_line(exc)}") from exc

    def _add(self, action: str, row: Base) -> int:
        with self._writing(action) as session:
            session.add(row)
            session.flush()
            return row.id  # type: ignore[attr-defined]

    def _update(self, action: str, model: type[Base], row_id: int, **values: Any) -> None:
        with self._writing(action) as session:
            statement = update(model).where(model.id == row_id).values(**values)  # type: ignore[attr-defined]
            result = session.execute(statement)
            if result.rowcount == 0:
                raise LookupError(f"run store: {action}: no {model.__tablename__} row with id {row_id}")

    # --- writes -------------------------------------------------------------

    def begin_run(self, *, config_path: str, pid: int, host: str) -> int:
        row = Run(config_path=str(config_path), pid=pid, host=host, status="running", started_at=utc_now())
        return self._add("begin_run", row)

    def finish_run(self, run_id: int, *, status: str, exit_code: int) -> None:
        self._update("finish_run", Run, run_id, status=_text(status), exit_code=exit_code, finished_at=utc_now())

    def begin_task(self, run_id: int, *, name: str, branch: str) -> int:
        row = TaskRun(run_id=run_id, name=name, branch=branch, outcome="running", started_at=utc_now())
        return self._add("begin_task", row)

    def finish_task(self, task_run_id: int, *, outcome: str, reason: str = "", commit: str = "") -> None:
        values = {"outcome": _text(outcome), "reason": reason, "commit": commit, "finished_at": utc_now()}
        self._update("finish_task", TaskRun, task_run_id, **values)

    def begin_iteration(self, task_run_id: int, *, number: int, checkpoint: str, pid: int, transcript: str = "") -> int:
        now = utc_now()
        row = Iteration(
            task_run_id=task_run_id,
            number=number,
            outcome="running",
            checkpoint=checkpoint,
            pid=pid,
            transcript=str(transcript),
            heartbeat_at=now,
            started_at=now,
        )
        return self._add("begin_iteration", row)

    def heartbeat(self, iteration_id: int) -> None:
        self._update("heartbeat", Iteration, iteration_id, heartbeat_at=utc_now())

    def finish_iteration(
        self,
        iteration_id: int,
        *,
        outcome: str,
        reason: str = "",
        correction: str = "",
        commit: str = "",
        turns: int = 0,
        tokens: int = 0,
    ) -> None:
        now = utc_now()
        self._update(
            "finish_iteration",
            Iteration,
            iteration_id,
            outcome=_text(outcome),
            reason=reason,
            correction=correction,
            commit=commit,
            turns=turns,
            tokens=tokens,
            heartbeat_at=now,
            finished_at=now,
        )

    def record_model_call(
        self,
        iteration_id: int,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        latency_ms: int,
        finish_reason: str = "",
        data: dict[str, Any] | None = None,
    ) -> None:
        row = Event(
            iteration_id=iteration_id,
            at=utc_now(),
            type=MODEL_CALL,
            name=finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            latency_ms=latency_ms,
            data=data or {},
        )
        self._add("record_model_call", row)

    def record_tool_call(
        self, iteration_id: int, *, name: str, ok: bool, message: str = "", data: dict[str, Any] | None = None
    ) -> None:
        row = Event(
            iteration_id=iteration_id,
            at=utc_now(),
            type=TOOL_CALL,
            name=name,
            ok=ok,
            message=message,
            data=data or {},
        )
        self._add("record_tool_call", row)

    def record_signal(self, iteration_id: int, *, level: str, kind: str, message: str) -> None:
        row = Event(
            iteration_id=iteration_id,
            at=utc_now(),
            type=SIGNAL,
            name=kind,
            level=_text(level),
            message=message,
            data={},
        )
        self._add("record_signal", row)

    # --- reads --------------------------------------------------------------

    def latest_run(self) -> RunView | None:
        """The most recently begun run, fully loaded."""
        # Ids grow with every insert on every backend, unlike clocks that can step back.
        with self._reading() as session:
            run = session.scalars(select(Run).order_by(Run.id.desc()).limit(1)).first()
            return _run_view(session, run) if run is not None else None

    def run(self, run_id: int) -> RunView | None:
        with self._reading() as session:
            run = session.get(Run, run_id)
            return _run_view(session, run) if run is not None else None

    def running_iterations(self) -> list[IterationView]:
        """Iterations still marked running, oldest first: in progress, or orphaned by a crash."""
        query = (
            select(Iteration, TaskRun.name)
            .join(TaskRun, Iteration.task_run_id == TaskRun.id)
            .where(Iteration.outcome == "running")
            .order_by(Iteration.id)
        )
        with self._reading() as session:
            return _iteration_views(session, session.execute(query).all())

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
            return _iteration_views(session, session.execute(query).all())

    @contextlib.contextmanager
    def _reading(self) -> Iterator[Session]:
        try:
            with self._sessions() as session:
                yield session
        except SQLAlchemyError as exc:
            raise StateError(f"run store: reading failed: {_one_line(exc)}") from exc


def _safe(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return repr(url)


def _run_view(session: Session, run: Run) -> RunView:
    tasks = session.scalars(select(TaskRun).where(TaskRun.run_id == run.id).order_by(TaskRun.id)).all()
    iterations = session.execute(
        select(Iteration, TaskRun.name)
        .join(TaskRun, Iteration.task_run_id == TaskRun.id)
        .where(TaskRun.run_id == run.id)
        .order_by(Iteration.id)
    ).all()
    by_task: dict[int, list[IterationView]] = defaultdict(list)
    for view in _iteration_views(session, iterations):
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
        )
        for task in tasks
    )
    return RunView(
        id=run.id,
        started_at=run.started_at,
        finished_at=run.finished_at,
        status=run.status,
        exit_code=run.exit_code,
        tasks=task_views,
        pid=run.pid,
        host=run.host,
        config_path=run.config_path,
    )


def _iteration_views(session: Session, rows: Sequence[tuple[Iteration, str]]) -> list[IterationView]:
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
    count_rows = session.execute(
        select(Event.iteration_id, Event.type, func.count())
        .where(Event.iteration_id.in_(ids), Event.type.in_((MODEL_CALL, TOOL_CALL)))
        .group_by(Event.iteration_id, Event.type)
    )
    for iteration_id, event_type, count in count_rows:
        counts[(iteration_id, event_type)] = count
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
            turns=it.turns,
            tokens=it.tokens,
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
