"""What a night writes as it goes: its run, task runs and iterations begun and ended, and their events.

Each begin or end commits at once, in its own short transaction (runs/store_transactions.py). The events a
call or a signal makes are queued and written a few at a time; an iteration's or a run's end waits for them
first, so no iteration is recorded ended before its events are in.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Sequence

from sqlalchemy import func, update

from orchestrator.surrogates import mend
from runs.event_rows import MODEL_CALL, SIGNAL, TOOL_CALL, event_row
from runs.models import Iteration, Run, TaskRun
from runs.store_transactions import StoreTransactions


def _text(value: Any) -> str:
    """Enum members (Level, outcomes) and plain strings alike, stored as their value."""
    return str(getattr(value, "value", value))


class RunWrites(StoreTransactions):
    """RunStore's writes of a night's runs, task runs, iterations and events."""

    def begin_run(
        self, *, config_path: str, pid: int, host: str, state_id: str | None = None, queued: Sequence[dict[str, Any]] | None = None,
        deadline: datetime | None = None,
    ) -> int:
        """`queued`: the tasks the night sets out to work ({"name", "branch", "work_key"} each, in the config's
        order), which a recovery of the run records if it died before it began them (`close_interrupted_run`).
        `deadline`: the `[night] deadline` instant it works to (Run.deadline), None without one."""
        run_id = self._add(
            "begin_run", Run, config_path=str(config_path), pid=pid, host=host, state_id=state_id, status="running", started_at=self.now(),
            queued=list(queued) if queued is not None else None, deadline=deadline,
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
