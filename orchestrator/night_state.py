"""`Night`: what the tasks of one night (possibly running in parallel) share, and what stops their work.

The deadline and the token budgets, the notes, the worktrees made ahead (worktrees_ahead.py), the keys that name a
task's work (work_keys.py), and what ends the waits for other workers' leases. One task's night uses its public
surface (task_night.py, with task_work.py and ended_without_work.py); the night makes it (orchestrator/night.py).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable

from orchestrator.ahead import AskedAhead
from orchestrator.cancel import Deadline, TokenBudget, deadline_after, named_zone, unreadable_tz
from orchestrator.config import Config, TaskConfig
from orchestrator.errors import StateError
from orchestrator.iteration import first_messages
from orchestrator.leases import LeaseHeld, lease_key
from orchestrator.notes import NotesBook
from orchestrator.redactor import Redactor
from orchestrator.tool_schemas import offered, schemas_of
from orchestrator.work_keys import work_key
from orchestrator.worktrees_ahead import WorktreesAhead
from runs.views import EarlierTonight

if TYPE_CHECKING:
    from orchestrator.night import NightParts

# A task cancelled because another task's error ended the night (the run `crashed`) before it began,
# or before its next iteration.
NIGHT_CRASHED = "night_crashed"

# `deadline_read_in_utc`'s why, as `report_times_in_utc` says it for the morning's times.
_DEADLINE_IN_UTC = (
    "TZ names no zone this host knows, nor is it a POSIX rule with an offset under a day: [night] deadline is read in UTC, "
    "the clock the C library falls back to"
)


def _on_the_schedules_clock(now: datetime, config: Config) -> datetime:
    """`now` in `[schedule] timezone` when that names a zone: a deadline is read on the clock the night
    starts by (a host on UTC serving New York's 01:30 read 06:30 as UTC's, a day after the start)."""
    zone = named_zone(config.schedule.timezone)
    return now.astimezone(zone) if zone is not None else now


def deadline_at(parts: NightParts) -> datetime | None:
    """`[night] deadline`'s instant: the next such time after the night began, on the schedule's clock; None without
    one. Worked out before the night's run is recorded, which keeps it (the morning's report says it)."""
    # The night began at its fire time when `serve` names one (begun again after a restart, or late within
    # the grace): read from the restart, 06:30 already past meant tomorrow's, a day more of work.
    began = parts.now()
    if parts.scheduled_for is not None:
        # On the night's own clock: the fire time comes with a fixed offset (`--scheduled-for 01:30+01:00`), and
        # read on that, 06:30 with `timezone = "local"` was an hour off on the nights the clocks change.
        began = parts.scheduled_for.astimezone(began.tzinfo)
    deadline = parts.config.night.deadline
    return deadline_after(_on_the_schedules_clock(began, parts.config), deadline) if deadline else None


class Night:
    """State shared by the tasks of one night (possibly running in parallel)."""

    def __init__(
        self, parts: NightParts, run_id: int, state_id: str | None, repository_key: str, tasks_pool: ThreadPoolExecutor,
        deadline: datetime | None,
    ) -> None:
        """`deadline`: deadline_at's instant (None without one), as the night's run recorded it."""
        self.parts = parts
        self._tasks_pool = tasks_pool
        self.run_id = run_id
        self.state_id = state_id
        self.notes = NotesBook(parts.config.notes_path)
        # Resolved once for the night: each resolution asks the file system about every folder of
        # the path, and every task's start asked for these several times, under the night's lock.
        self.repo_path, self.state_dir = parts.config.repo_path, parts.config.state_dir
        self.transcripts_dir, self.git_config_copy = parts.config.transcripts_dir, parts.config.git_config_copy
        self.redact = Redactor.for_config(parts.config)
        self.log = parts.log.bind(run_id=run_id)
        self.budget = TokenBudget(parts.config.night.max_tokens_per_night, "night")
        self.earlier = EarlierTonight()
        if parts.scheduled_for is not None:
            self.earlier = parts.store.earlier_tonight(state_id, parts.scheduled_for, run_id)
            self.budget.spend(self.earlier.total_tokens)
            if self.earlier.tokens:
                self.log.info(
                    "night_resumed", scheduled_for=parts.scheduled_for.isoformat(), done=len(self.earlier.succeeded), tokens=self.earlier.total_tokens
                )
        self._repository_key = repository_key  # shared_repository_key's, worked out once by run_night
        self.deadline = self._deadline(deadline)
        # A night begun again judges its first iteration by its fire's earlier runs' (06:20, a 40-minute iteration
        # before the restart: none starts to be cancelled at 06:30).
        self._slowest_iteration_s = self.earlier.slowest_iteration_s
        self._lock = threading.Lock()
        # Set when an error ends a task and with it the night (crash).
        self.crashed = threading.Event()
        # Set when a task paused for an unreachable model (task_ended): the night exits 3 whatever else it
        # does, and could work no task whose lease it waited for (why_stop_waiting).
        self.model_unreachable = threading.Event()
        # Set once anything that ends the waits for other workers' leases has happened (why_stop_waiting):
        # a set-aside task's pause ends then, not up to LEASE_POLL_S later with the night's end held up.
        # Set in two places only: by a cancel (the hook below), and by _end_waits_if_over for the rest.
        self.waits_over = threading.Event()
        parts.cancel.on_cancel(self.waits_over.set)
        self.worktrees = WorktreesAhead(
            parts.config, parts.repo, self.repo_path, self.state_dir, run_id=run_id, log=self.log, cancel=parts.cancel
        )

    def _deadline(self, at: datetime | None) -> Deadline:
        """`[night] deadline`'s instant `at` (deadline_at), watched."""
        parts, deadline = self.parts, self.parts.config.night.deadline
        watched = Deadline(at, parts.cancel, parts.now)
        if at is not None and at.tzinfo is timezone.utc and (unreadable := unreadable_tz()) is not None:
            # local_now's UTC for a TZ the C library cannot read: 06:30 was UTC's with nothing said (TZ=Europe/Pariss).
            self.log.warning("deadline_read_in_utc", tz=unreadable, deadline=deadline, at=at.isoformat(), why=_DEADLINE_IN_UTC)
        return watched

    def lease_key(self, task: TaskConfig) -> str:
        return lease_key(task.name, self._repository_key)

    def lease_held_elsewhere(self, task: TaskConfig) -> str:
        """Who holds the task's lease now, as LeaseHeld names them ("" when it is free): another worker, since this
        night's own tasks hold only their own leases and its dead nights' were freed by its recovery."""
        key = self.lease_key(task)
        holder = self.parts.store.lease_holder(key)
        return str(LeaseHeld(key, holder)) if holder else ""

    def work_key(self, task: TaskConfig) -> str:
        """What the task's work is (see runs.models.TaskRun.work_key): a task renamed, or its prompt or check
        changed, is other work; in a store other workers share, the repository's too."""
        return work_key(self._repository_key, task)

    @property
    def shares_store(self) -> bool:
        """Whether other workers (state dirs) may share the run store and so the work."""
        return bool(self._repository_key)

    def done_elsewhere(self, work_key: str) -> str | None:
        """The host where another worker sharing the store finished the work tonight, if one did: since
        this run began, or, for a scheduled night begun again, since its fire time (what another finished
        between the fire's earlier run and this one is done too)."""
        if not self.shares_store:
            return None
        return self.parts.store.succeeded_elsewhere(work_key, self.run_id, since=self.parts.scheduled_for)

    def position(self, task: TaskConfig) -> int | None:
        """The task's place in the config (the order reports list the night's tasks in)."""
        return next((at for at, named in enumerate(self.parts.config.task) if named.name == task.name), None)

    def ask_ahead(self, task: TaskConfig, task_run_id: int, log: Any, cancel: Any) -> AskedAhead:
        """The model, with the task's first request already on its way (see orchestrator/ahead.py).
        `log`: the task's, bound to its name and `task_run_id`. `cancel`: the task's token, which cuts its calls
        (a lost lease; the night's cancel reaches it too), and no other task's."""
        tool_names = offered(task.tools)
        messages = first_messages(task, self.parts.config.night, tool_names, self.notes, self.parts.context_window)
        unused = functools.partial(self._unused_answer, task_run_id, log)
        model = self.parts.model
        own_model = hasattr(model, "for_task")
        if own_model:
            model = model.for_task(cancel)
        # The token that cuts the call: the shared model hears the night's only (a lost lease is seen after its call).
        cuts = cancel if own_model else self.parts.cancel
        return AskedAhead(model, messages, schemas_of(tool_names), unused=unused, cancel=cuts, own_model=own_model)

    def _unused_answer(self, task_run_id: int, log: Any, tokens: int) -> None:
        """A first answer the task ended without taking (its branch checked out, the deadline or a budget
        came first): its tokens were spent, and a night's budget is what may be spent in all. Logged on the
        task's logger: a task's event carries its `task_run_id` (docs/reference.md), not the name alone.
        Kept on the task's row too, so that the report's figures add up to what the budget counted."""
        self.budget.spend(tokens)
        log.info("first_answer_unused", tokens=tokens)
        # Called back from a future (perhaps as the night ends): a failing store is the night's next write's to tell.
        with contextlib.suppress(StateError):
            self.parts.store.add_unused_tokens(task_run_id, tokens)

    def why_not_start_iteration(self) -> str:
        """Why no iteration may start now ("" if one may). None starts that could not finish
        by the deadline, judged by the slowest so far: that refuses the asking task only (the
        others' iterations in flight go on), and the deadline itself stops the night."""
        if stopping := self._why_stopping():
            return stopping
        if not self.deadline.allows(self._slowest_iteration_s):
            return "deadline"
        return ""

    def why_stop_waiting(self) -> str:
        """Why a task set aside for another worker's lease should wait no longer ("" if it may): what stops
        the night, and an unreachable model. Not the slowest iteration's time to the deadline: a lease let go
        before the deadline may be a task done elsewhere, which needs no time (one to work is refused then)."""
        return self._why_stopping() or ("model_unreachable" if self.model_unreachable.is_set() else "")

    def crash(self) -> None:
        """An error ended a task and with it the night: no task or iteration starts after it (NIGHT_CRASHED)."""
        self.crashed.set()
        self._end_waits_if_over()

    def task_ended(self, reason: str) -> None:
        """A task has ended, for `reason`: an unreachable model ends the night's work too (exit 3)."""
        if reason == "model_unreachable":
            self.model_unreachable.set()
        self._end_waits_if_over()

    def _end_waits_if_over(self) -> None:
        """Sets waits_over once a crash, an unreachable model or the night's spent budget ends the waits for
        leases (a cancel sets it through its hook). Asked as each task ends: the budget is spent in the tasks'
        model calls, and a waiting task hears of it when the task that spent it ends."""
        if self.crashed.is_set() or self.model_unreachable.is_set() or self.budget.exhausted:
            self.waits_over.set()

    def _why_stopping(self) -> str:
        """What stops the night's work (a lost state dir raises StateError), or ""."""
        self.parts.check_lock()
        if self.parts.cancel.cancelled:
            return self.parts.cancel.why
        if self.crashed.is_set():
            return NIGHT_CRASHED
        if self.budget.exhausted:
            # Refused here, not cancelled for all: the iteration whose answer crossed the budget is
            # still checked and committed (its `submit` may carry finished work), while the others'
            # loops stop at their next model call (orchestrator.agent: budgets asked before each).
            return self.budget.why
        return ""

    def set_aside(self, try_again: Callable[[], Any]) -> Future[Any] | None:
        """`try_again` queued behind the night's other tasks (the pool takes them in order), so it waits no slot
        that startable work could use; None when the night is ending and takes nothing more."""
        try:
            return self._tasks_pool.submit(try_again)
        except RuntimeError:  # the pool was shut down: a crash ends the night
            return None

    def task_budget(self, work_key: str) -> TokenBudget:
        """A task's own token budget, less what its work spent in earlier runs of this scheduled night."""
        budget = TokenBudget(self.parts.config.night.max_tokens_per_task, "task")
        budget.spend(self.earlier.tokens.get(work_key, 0))
        return budget

    def iteration_took(self, seconds: float) -> None:
        with self._lock:
            self._slowest_iteration_s = max(self._slowest_iteration_s, seconds)
