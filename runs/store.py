"""The run store: what happened each night, written as it happens.

Every state change (a run, task or iteration begun or ended, a lease) commits
at once in its own short transaction, so another process (the CLI's `report`,
a second night after a crash) sees it immediately. Events (model calls, tool
calls, signals) are queued and written a few at a time by runs/event_writer.py;
every state change first waits for them, so the store never shows an iteration
ended before its events.

The database it is kept in comes from runs/engine.py (the engine a `[store] url`
makes), its tables from runs/schema.py (created, or brought up to this version's).
What it reads comes back as runs/views.py's frozen views, built by runs/views_from_rows.py;
what other runs did with a work is asked by runs/work_of_other_runs.py's queries.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import tempfile
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator, Sequence

from sqlalchemy import Connection, Engine, create_engine, delete, func, insert, or_, select, update
from sqlalchemy.engine import URL
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.errors import StateError
from orchestrator.surrogates import mend
from runs.engine import database_complaint, make_engine, safe_url, sqlite_database_file, sqlite_uri, sqlite_url
from runs.event_batches import EventBatches
from runs.event_rows import MODEL_CALL, SIGNAL, TOOL_CALL, event_row
from runs.event_writer import EventWriter
from runs.models import Base, Event, Iteration, Lease, Run, TaskRun, utc_now
from runs.old_runs import RUNS_PER_BATCH, remove_a_batch
from runs.schema import TableBusy, create_schema, lacks_columns
from runs.upserts import upsert_of
from runs.views import EarlierTonight, IterationView, LeaseView, RunView, TaskView, worst_signal
from runs.views_from_rows import iteration_views, run_header, run_view
from runs.work_of_other_runs import read_earlier_tonight, succeeded_elsewhere_query

__all__ = ["RunStore", "RunView", "TaskView", "IterationView", "LeaseView", "worst_signal"]


def _text(value: Any) -> str:
    """Enum members (Level, outcomes) and plain strings alike, stored as their value."""
    return str(getattr(value, "value", value))


class RunStore:
    """Runs, task runs, iterations and their events, in one SQL database."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        # SQLite takes one writer at a time, and its busy handler retries after sleeping
        # 1, 2, 5, 10, 15... ms: N tasks starting or ending together would wait tens of
        # milliseconds for a write of a fraction of one. This process's threads queue here
        # instead and are woken the moment the write before theirs commits; another
        # process (rare: the state dir's lock keeps out a second night) still meets busy_timeout.
        self._one_writer: Any = threading.Lock() if engine.dialect.name == "sqlite" else contextlib.nullcontext()
        self._event_batches = EventBatches(engine)
        self._events = EventWriter(self._event_batches.write, database_complaint, write_lock=self._one_writer)
        # The last run this object began: the night of this process, whatever others share the store.
        self.begun_run_id: int | None = None
        # Leases go by one clock. Machines sharing a PostgreSQL store each keep their own, which
        # may be off by more than a ttl: there, "now" is the database's (now(), its transaction's
        # start), so no host takes a live lease by its clock or writes one already expired.
        # A SQLite file is one host's: that host's clock.
        self._database_clock = engine.dialect.name == "postgresql"
        # How far the database's clock is ahead of this host's (measured at `open`): the times this
        # store writes are the database's there too, so that one machine's "finished after that night
        # began" (`succeeded_elsewhere`) is judged by one clock, not two that may disagree.
        self._clock_offset = timedelta(0)

    @classmethod
    def open(cls, url: str) -> RunStore:
        """Connect and create missing tables; StateError (one line) if the store cannot be used."""
        engine: Engine | None = None
        try:
            engine = make_engine(url)
            create_schema(engine)
        # ImportError: the URL names a database driver that is not installed; ValueError, TypeError:
        # a query argument the driver cannot take (`?timeout=abc`), should one get past the config's check.
        except (SQLAlchemyError, OSError, ImportError, ValueError, TypeError, TableBusy) as exc:
            if engine is not None:
                engine.dispose()
            raise StateError(f"cannot open run store {safe_url(url)}: {database_complaint(exc)}") from exc
        store = cls(engine)
        if store._database_clock:
            store._clock_offset = _database_clock_offset(engine, url)
        return store

    @classmethod
    def open_for_reading(cls, url: str) -> RunStore | None:
        """`open`, or, for a SQLite file that cannot be opened for writing (the file system went
        read-only in the night), the file as it is: the morning can still read its account.
        None when the SQLite file does not exist yet: reading creates nothing."""
        database = sqlite_database_file(url)
        if database is not None and not database.exists():
            return None
        try:
            return cls.open(url)
        except StateError:
            if database is None or not database.is_file():
                raise
        # immutable: no lock, no -shm file, no WAL read (a clean close leaves none to read). A URL made, not parsed:
        # parsing decodes the URI's escapes once before SQLite does, and a file named runs%41.db was read as runsA.db.
        query = {"mode": "ro", "immutable": "1", "uri": "true"}
        engine = create_engine(URL.create("sqlite", database=sqlite_uri(database.resolve()), query=query))
        if not lacks_columns(engine):
            return cls(engine)
        # An older version's store, which cannot get its new columns here: read from a copy that can.
        engine.dispose()
        folder = Path(tempfile.mkdtemp(prefix="overnight-store-"))
        atexit.register(shutil.rmtree, folder, True)
        copy = folder / database.name
        shutil.copyfile(database, copy)
        return cls.open(sqlite_url(copy))

    def now(self) -> datetime:
        """The time this store writes: this host's clock, or in a PostgreSQL store the database's."""
        return utc_now() + self._clock_offset

    def on_this_hosts_clock(self, moment: datetime) -> datetime:
        """A time this store wrote, read on this host's clock (to compare with a process's start)."""
        return moment - self._clock_offset

    def close(self) -> None:
        self._events.close()
        self._event_batches.close()
        self._engine.dispose()

    def flush(self) -> None:
        """Wait until the queued events are written (reads and the writes that must follow them do this first)."""
        self._events.flush()

    @contextlib.contextmanager
    def _writing(self, action: str) -> Iterator[Session]:
        """One short transaction, committed on exit; database failures become StateError."""
        self._events.flush()
        try:
            with self._one_writer, self._sessions.begin() as session:
                yield session
        except SQLAlchemyError as exc:
            raise StateError(f"run store: {action} failed: {database_complaint(exc)}") from exc

    @contextlib.contextmanager
    def _statements(
        self, action: str, *, expected: tuple[type[SQLAlchemyError], ...] = (), after_events: bool = True
    ) -> Iterator[Connection]:
        """Like `_writing`, on a plain connection: the per-task writes are single statements,
        and the ORM's unit of work would double their cost when N tasks start at once.
        Errors in `expected` are an answer, not a failure: they reach the caller as they are.

        `after_events=False` for a write that needs no queued event before it (a task or an
        iteration begun, a task ended after its iterations, a lease): waiting for the queue
        would wait for the other tasks' events, and hurry their batch, for nothing.
        """
        if after_events:
            self._events.flush()
        try:
            with self._one_writer, self._engine.begin() as connection:
                yield connection
        except expected:
            raise
        except SQLAlchemyError as exc:
            raise StateError(f"run store: {action} failed: {database_complaint(exc)}") from exc

    def _add(self, action: str, model: type[Base], *, after_events: bool = True, **values: Any) -> int:
        with self._statements(action, after_events=after_events) as connection:
            return connection.execute(insert(model.__table__), values).inserted_primary_key[0]

    def _update(self, action: str, model: type[Base], row_id: int, *, after_events: bool = True, **values: Any) -> None:
        table = model.__table__
        with self._statements(action, after_events=after_events) as connection:
            result = connection.execute(update(table).where(table.c.id == row_id).values(**values))
            if result.rowcount == 0:
                raise LookupError(f"run store: {action}: no {table.name} row with id {row_id}")

    def _add_event(self, values: dict[str, Any], *, heartbeat: bool = False) -> None:
        """Queue one event (and, if asked, a beat of the iteration's heartbeat): see runs/event_writer.py."""
        if self._clock_offset:
            values["at"] += self._clock_offset
        self._events.put(values, beat=heartbeat)

    # --- writes -------------------------------------------------------------

    def begin_run(
        self, *, config_path: str, pid: int, host: str, state_id: str | None = None, queued: Sequence[dict[str, Any]] | None = None
    ) -> int:
        """`queued`: the tasks the night sets out to work ({"name", "branch", "work_key"} each, in the config's
        order), which a recovery of the run records if it died before it began them (`close_interrupted_run`)."""
        run_id = self._add(
            "begin_run", Run, config_path=str(config_path), pid=pid, host=host, state_id=state_id, status="running", started_at=self.now(),
            queued=list(queued) if queued is not None else None,
        )
        self.begun_run_id = run_id
        return run_id

    def finish_run(self, run_id: int, *, status: str, exit_code: int) -> None:
        self._update("finish_run", Run, run_id, status=_text(status), exit_code=exit_code, finished_at=self.now())

    def begin_task(self, run_id: int, *, name: str, branch: str, work_key: str | None = None, position: int | None = None) -> int:
        """`position`: the task's place in the config, the order a run's view lists its tasks in."""
        return self._add(
            "begin_task", TaskRun, after_events=False,
            run_id=run_id, name=name, branch=branch, outcome="running", started_at=self.now(), work_key=work_key, position=position,
        )

    def finish_task(self, task_run_id: int, *, outcome: str, reason: str = "", commit: str = "", detail: str = "") -> None:
        """`detail`: what `reason` alone does not say (a paused task's endpoint and error), redacted already."""
        # mend: an error's text can quote a path that is not UTF-8 (a lone surrogate), which the database refuses.
        kept = mend(detail) or None
        values = {"outcome": _text(outcome), "reason": reason, "commit": commit, "detail": kept, "finished_at": self.now()}
        # Its iterations' events are in: each iteration's end waited for them.
        self._update("finish_task", TaskRun, task_run_id, after_events=False, **values)

    def wait_task_for_lease(self, task_run_id: int) -> None:
        """The task is set aside, waiting for a lease another live worker holds: still `running`, its reason
        `leased` until it is worked (`resume_task`) or recorded skipped; a night killed meanwhile leaves it so
        (`close_interrupted_run`)."""
        self._update("wait_task_for_lease", TaskRun, task_run_id, after_events=False, reason="leased")

    def resume_task(self, task_run_id: int) -> None:
        """A task that waited for a lease took it: its reason cleared, and its time counted from now (a
        waiting task's time was the other worker's work, not its own)."""
        self._update("resume_task", TaskRun, task_run_id, after_events=False, reason="", started_at=self.now())

    def heartbeat_run(self, run_id: int) -> None:
        """A sign of life of run `run_id`'s night, which a waiting task's every try writes (the run's `heartbeat_at`):
        recovery dates a dead run's end to its latest write (`_last_seen_alive`)."""
        self._update("heartbeat_run", Run, run_id, after_events=False, heartbeat_at=self.now())

    def add_unused_tokens(self, task_run_id: int, tokens: int) -> None:
        """The tokens of a first answer the task ended without taking (see TaskRun.unused_tokens)."""
        unused = func.coalesce(TaskRun.unused_tokens, 0) + tokens
        with self._statements("add_unused_tokens", after_events=False) as connection:
            connection.execute(update(TaskRun).where(TaskRun.id == task_run_id).values(unused_tokens=unused))

    def begin_iteration(self, task_run_id: int, *, number: int, checkpoint: str, pid: int, transcript: str = "") -> int:
        now = self.now()
        return self._add(
            "begin_iteration",
            Iteration,
            after_events=False,
            task_run_id=task_run_id,
            number=number,
            outcome="running",
            checkpoint=checkpoint,
            pid=pid,
            transcript=str(transcript),
            heartbeat_at=now,
            started_at=now,
        )

    def heartbeat(self, iteration_id: int) -> None:
        self._update("heartbeat", Iteration, iteration_id, after_events=False, heartbeat_at=self.now())

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
        note_owed: bool | None = None,
        at: datetime | None = None,
    ) -> None:
        """`note_owed`: True for an ending whose notes.md entry is yet to be written (see `owed_notes`);
        `at`: when it ended, if the caller needs the very time (its note's header shows it), else now."""
        now = at or self.now()
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
            note_owed=note_owed,
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
        """Record a model call; it also beats the iteration's heartbeat, in the same transaction (an answer is a sign of life)."""
        values = event_row(iteration_id, MODEL_CALL, name=finish_reason, data=data)
        values.update(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, latency_ms=latency_ms)
        self._add_event(values, heartbeat=True)

    def record_tool_call(
        self, iteration_id: int, *, name: str, ok: bool, message: str = "", data: dict[str, Any] | None = None
    ) -> None:
        values = event_row(iteration_id, TOOL_CALL, name=name, message=message, data=data)
        values["ok"] = ok
        self._add_event(values)

    def record_signal(self, iteration_id: int, *, level: str, kind: str, message: str) -> None:
        values = event_row(iteration_id, SIGNAL, name=kind, message=message)
        values["level"] = _text(level)
        self._add_event(values)

    # --- leases: one worker per task, across processes and hosts -------------

    def _lease_times(self, ttl_s: float) -> tuple[Any, Any]:
        """Now and the expiry of a lease taken now: SQL expressions on the database's clock, or this host's times."""
        now = func.now() if self._database_clock else utc_now()
        return now, now + timedelta(seconds=ttl_s)

    def acquire_lease(self, task: str, owner: str, ttl_s: float) -> bool:
        """Take the task's lease if it is free, expired or already ours; False if someone else holds it."""
        now, expires = self._lease_times(ttl_s)
        values = dict(task=task, owner=owner, acquired_at=now, expires_at=expires)
        takeable = or_(Lease.owner == owner, Lease.expires_at <= now)
        upsert = upsert_of(self._engine.dialect)
        if upsert is not None:
            # One statement, atomic on the database: an INSERT, then an UPDATE, told an expired lease
            # deleted between the two (another machine's recovery releasing it) that it was held.
            statement = upsert(Lease).values(**values)
            statement = statement.on_conflict_do_update(
                index_elements=[Lease.task],
                set_={name: statement.excluded[name] for name in ("owner", "acquired_at", "expires_at")},
                where=takeable,
            )
            with self._statements("acquire_lease", after_events=False) as connection:
                if self._engine.dialect.name == "postgresql":  # psycopg gives no rowcount for it
                    return len(connection.execute(statement.returning(Lease.task)).all()) == 1
                return connection.execute(statement).rowcount == 1
        for _ in range(3):  # another database: an INSERT for a free lease, a conditional UPDATE for one taken
            try:
                with self._statements("acquire_lease", expected=(IntegrityError,), after_events=False) as connection:
                    connection.execute(insert(Lease).values(**values))
                return True
            except IntegrityError:
                pass  # a row exists: ours, expired, or someone else's
            with self._statements("acquire_lease", after_events=False) as connection:
                if connection.execute(update(Lease).where(Lease.task == task, takeable).values(**values)).rowcount:
                    return True
                if connection.execute(select(Lease.task).where(Lease.task == task)).first() is not None:
                    return False  # held by someone else
        return False

    def renew_lease(self, task: str, owner: str, ttl_s: float) -> bool:
        """Push the expiry forward; False if the lease is no longer ours (taken over after expiry)."""
        _, expires = self._lease_times(ttl_s)
        with self._statements("renew_lease", after_events=False) as connection:
            statement = update(Lease).where(Lease.task == task, Lease.owner == owner).values(expires_at=expires)
            return connection.execute(statement).rowcount == 1

    def release_lease(self, task: str, owner: str) -> None:
        """Give the lease back; nothing happens if it is not ours any more."""
        with self._statements("release_lease", after_events=False) as connection:
            connection.execute(delete(Lease).where(Lease.task == task, Lease.owner == owner))

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
        that worked it ended."""
        with self._reading() as session:
            return read_earlier_tonight(session, state_id, since + self._clock_offset, run_id)

    def leases(self) -> list[LeaseView]:
        with self._reading() as session:
            rows = session.scalars(select(Lease).order_by(Lease.task)).all()
            return [LeaseView(task=r.task, owner=r.owner, acquired_at=r.acquired_at, expires_at=r.expires_at) for r in rows]

    # --- crash recovery -------------------------------------------------------

    def running_runs(self) -> list[RunView]:
        """Runs still marked running: in progress, or left behind by a process that died."""
        with self._reading() as session:
            runs = session.scalars(select(Run).where(Run.status == "running").order_by(Run.id)).all()
            return [run_view(session, run) for run in runs]

    def run_of_task_run(self, task_run_id: int) -> RunView:
        """The run a task run belongs to (without its tasks): who owned it, on which host."""
        with self._reading() as session:
            return run_header(session.get(Run, session.get(TaskRun, task_run_id).run_id))

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

    def remove_old_runs(
        self, state_id: str, older_than: timedelta, *, keep_begun_since: datetime | None = None, shared: bool = True
    ) -> Iterator[int]:
        """Remove state dir `state_id`'s runs that ended more than `older_than` ago (the store's clock) with all their
        rows, batch by batch (runs/old_runs.py says which may go), each batch in a transaction of its own: a kill
        midway leaves whole runs. Yields how many runs each batch removed, once it is committed; StateError if one
        fails. `keep_begun_since` (this host's clock: a scheduled night's fire time): runs begun since then stay.
        `shared` (a store other state dirs may use): the newest run that finished each work with success stays, so a
        dead night's recovery still finds the work it waited for done elsewhere; not `shared` (the state dir's own
        SQLite file), the runs an older version recorded with no state dir's name are this state dir's too."""
        ended_before = self.now() - older_than
        begun_before = None if keep_begun_since is None else keep_begun_since + self._clock_offset
        removed = RUNS_PER_BATCH
        while removed == RUNS_PER_BATCH:  # fewer: none left to remove
            with self._statements("remove_old_runs") as connection:
                removed = remove_a_batch(connection, state_id, ended_before=ended_before, begun_before=begun_before, shared=shared)
            if removed:
                yield removed

    def integrity_problems(self) -> list[str]:
        """SQLite's own integrity check ([] when sound); always [] on other backends."""
        self._events.flush()
        if self._engine.dialect.name != "sqlite":
            return []
        with self._engine.connect() as connection:
            rows = [row[0] for row in connection.exec_driver_sql("PRAGMA integrity_check")]
        return [] if rows == ["ok"] else rows

    # --- reads --------------------------------------------------------------

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

    @contextlib.contextmanager
    def _reading(self) -> Iterator[Session]:
        self._events.flush()
        try:
            with self._sessions() as session:
                yield session
        except SQLAlchemyError as exc:
            raise StateError(f"run store: reading failed: {database_complaint(exc)}") from exc


def _database_clock_offset(engine: Engine, url: str) -> timedelta:
    """The database's clock minus this host's, to within half a round trip."""
    try:
        before = utc_now()
        with engine.connect() as connection:
            database_now = connection.execute(select(func.now())).scalar_one()
        after = utc_now()
    except SQLAlchemyError as exc:
        engine.dispose()
        raise StateError(f"cannot open run store {safe_url(url)}: {database_complaint(exc)}") from exc
    if database_now.tzinfo is None:
        database_now = database_now.replace(tzinfo=timezone.utc)
    return database_now - (before + (after - before) / 2)
