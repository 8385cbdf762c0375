"""The run store's tables: runs, task runs, iterations and their events.

Only portable column types are used, so the same schema works on SQLite (the
default) and on PostgreSQL given through the store URL.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, ForeignKey, Index, Integer, String, Text, TypeDecorator
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class UtcDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend.

    SQLite keeps no offset and hands back naive values; storing UTC and tagging
    it again on the way out keeps comparisons with `utc_now()` valid everywhere.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: the run store only takes aware datetimes")
        utc = value.astimezone(timezone.utc)
        # SQLite would store the offset as text and compare strings; keep it plain UTC there.
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class Str(TypeDecorator[str]):
    """A string column; on PostgreSQL, whose text cannot hold NUL, a NUL is written as the four characters `\\x00`.

    Command output and check output (an event's message, a correction) can hold one; refused,
    it would fail the whole write, and with it the night.
    """

    impl = String
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Any) -> str | None:
        if value is not None and dialect.name == "postgresql" and "\x00" in value:
            return value.replace("\x00", "\\x00")
        return value


class LongStr(Str):
    """`Str` as an unbounded TEXT column."""

    impl = Text
    cache_ok = True


class Base(DeclarativeBase):
    pass


class Run(Base):
    """One night: one process of `overnight run`."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    started_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utc_now)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    # 'running' | 'finished' | 'cancelled' | 'crashed'
    status: Mapped[str] = mapped_column(Str, default="running")
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    pid: Mapped[int] = mapped_column(Integer)
    host: Mapped[str] = mapped_column(Str)
    config_path: Mapped[str] = mapped_column(Str)
    # The state dir the night ran in (orchestrator.lock.state_identity), in a store several
    # may share; null for runs recorded before it existed.
    state_id: Mapped[str | None] = mapped_column(Str, nullable=True)
    # The tasks the night set out to work, in the config's order ({"name", "branch", "work_key"} each):
    # a night killed (kill -9, a power cut) before it began some has no row of theirs, and its
    # recovery records them from this. Null for runs recorded before it existed.
    queued: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    # The night's last sign of life while it writes nothing else (its tasks all waiting for other workers'
    # leases: RunStore.heartbeat_run at each try): recovery dates a killed night's end to its latest write,
    # which would otherwise be the wait's start. Null until then (and in runs recorded before it existed).
    heartbeat_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    # The `[night] deadline` instant the night worked to (night_started's `deadline`), on this host's clock as the
    # night read it, not shifted onto the store's: the morning's report shows it as the HH:MM the config says.
    # Null without a deadline (and in runs recorded before it existed).
    deadline: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)


class TaskRun(Base):
    """One task as worked on during one run."""

    __tablename__ = "task_runs"
    # Who finished a work with success, and when: each task's start in a shared store asks it of one work
    # (runs.work_of_other_runs.succeeded_elsewhere_query: a seek, not a scan of every task run), and the removal
    # of old runs of every work (runs.old_runs._newest_work_done, whose join SQLite's plan serves with it). Stores
    # an older version made get it when opened (runs.schema._add_missing_indexes).
    __table_args__ = (Index("ix_task_runs_work_key", "work_key", "outcome", "finished_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    name: Mapped[str] = mapped_column(Str, index=True)
    branch: Mapped[str] = mapped_column(Str)
    # A TaskOutcome value.
    outcome: Mapped[str] = mapped_column(Str, default="running")
    reason: Mapped[str] = mapped_column(Str, default="")
    commit: Mapped[str] = mapped_column(Str, default="")
    started_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utc_now)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    # What the work is: the task's name, prompt and check, hashed, with, in a store several workers
    # share, the repository (its first commits): two projects' tasks of one name differ there.
    # None in runs of versions that set it only in shared stores.
    work_key: Mapped[str | None] = mapped_column(Str, nullable=True)
    # Where the task stands in the config: reports list a night's tasks in that order, not in the
    # order their threads happened to begin them (with concurrency, another each night).
    position: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Tokens of the task's first answer, asked for while its worktree was made, that the task ended
    # without taking (first_answer_unused): spent, and counted in the night's budget, but in no
    # iteration. Null when none (and in runs recorded before it existed).
    unused_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # What its reason code alone does not say, redacted: a paused task's endpoint and error (the ModelUnreachable's
    # message, otherwise only in the JSON log's iteration_model_unreachable). Null when nothing (and in runs recorded
    # before it existed).
    detail: Mapped[str | None] = mapped_column(Str, nullable=True)


class Iteration(Base):
    """One attempt at a task: checkpoint, agent run, check, commit or rollback."""

    __tablename__ = "iterations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_run_id: Mapped[int] = mapped_column(ForeignKey("task_runs.id"), index=True)
    # 1-based within the task for this run; a scheduled night begun again numbers on from its fire's earlier runs.
    number: Mapped[int] = mapped_column(Integer)
    # An IterationOutcome value; indexed because recovery looks for 'running'.
    outcome: Mapped[str] = mapped_column(Str, default="running", index=True)
    reason: Mapped[str] = mapped_column(Str, default="")
    correction: Mapped[str] = mapped_column(LongStr, default="")
    checkpoint: Mapped[str] = mapped_column(Str)
    commit: Mapped[str] = mapped_column(Str, default="")
    turns: Mapped[int] = mapped_column(Integer, default=0)
    tokens: Mapped[int] = mapped_column(Integer, default=0)
    transcript: Mapped[str] = mapped_column(Str, default="")
    # The process that owns the iteration; recovery checks whether it is still alive.
    pid: Mapped[int] = mapped_column(Integer)
    heartbeat_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utc_now)
    started_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utc_now)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime, nullable=True)
    # True from the moment an ending that writes a notes.md entry is recorded until the entry is
    # written (False then): one still owed after its night (killed, a full disk) is written by the
    # next night's recovery. None: no entry (a commit), or a store made before this column.
    note_owed: Mapped[bool | None] = mapped_column(Boolean, nullable=True)


class Event(Base):
    """Something that happened inside an iteration: a model call, a tool call, a signal."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    iteration_id: Mapped[int] = mapped_column(ForeignKey("iterations.id"), index=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime, default=utc_now)
    # 'model_call' | 'tool_call' | 'signal' | others
    type: Mapped[str] = mapped_column(Str)
    # Tool name, signal kind, or the model's finish reason.
    name: Mapped[str] = mapped_column(Str, default="")
    # A Level value for signals, '' otherwise.
    level: Mapped[str] = mapped_column(Str, default="")
    message: Mapped[str] = mapped_column(LongStr, default="")
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    latency_ms: Mapped[int] = mapped_column(Integer, default=0)
    ok: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class Lease(Base):
    """Who works on a task right now; a process keeps it alive by renewing before `expires_at`.

    Leases let several processes (even on several machines sharing one store)
    agree that a task has one worker at a time, without trusting pids across hosts.
    """

    __tablename__ = "leases"

    task: Mapped[str] = mapped_column(Str, primary_key=True)
    # "host:pid:nonce" of the holder.
    owner: Mapped[str] = mapped_column(Str)
    acquired_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utc_now)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime)
