"""A night: every task through iterations until it succeeds or stops; up to N tasks at once.

The night is here: its run, its pool of tasks, and `_Night`, what its tasks share. One task's night
(its row, its lease, its iterations, its waits for another worker's lease) is orchestrator/task_night.py's.

Exit codes are the public contract of `overnight run`:
0 every task succeeded; 1 at least one did not; 3 the model endpoint was unreachable;
129/130/143 the night was cancelled by SIGHUP/SIGINT/SIGTERM (128 + the signal's number,
as a shell reports a process the signal killed).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import socket
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Sequence

import structlog

from orchestrator.cancel import CancelToken, Deadline, TokenBudget, deadline_after, local_now, named_zone, unreadable_tz
from orchestrator.config import Config, TaskConfig
from orchestrator.errors import ModelUnreachable, StateError
from orchestrator.ahead import AskedAhead
from orchestrator.iteration import first_messages
from orchestrator.leases import lease_key
from orchestrator.lock import state_identity
from orchestrator.notes import NotesBook
from orchestrator.protocols import Guard, Model, SignalSink
from orchestrator.records import DONE_EARLIER_TONIGHT, DONE_ELSEWHERE, TaskOutcome, counts_as_succeeded
from orchestrator.redactor import Redactor
from orchestrator.repository import open_repo
from orchestrator.secrecy import withheld
from orchestrator.task_branches import branch_for
from orchestrator.task_night import (
    BRANCH_CHECKED_OUT,
    FAILED_EARLIER_TONIGHT,
    LEASE_POLL_S,
    PARK_CORRECTION,
    PARKED_EARLIER_TONIGHT,
    TaskSummary,
    run_task,
    summary_of,
)
from orchestrator.tool_schemas import offered, schemas_of
from orchestrator.worktree import Worktree
from runs.engine import sqlite_files
from runs.views import EarlierTonight

EXIT_OK, EXIT_TASKS_FAILED, EXIT_USAGE, EXIT_MODEL_UNREACHABLE = 0, 1, 2, ModelUnreachable.exit_code
EXIT_SIGHUP, EXIT_SIGINT, EXIT_SIGTERM = 129, 130, 143
# The signals that stop a night (its CancelToken's `why` names one), and the exit code each leaves.
SIGNAL_EXIT_CODES = {"SIGHUP": EXIT_SIGHUP, "SIGINT": EXIT_SIGINT, "SIGTERM": EXIT_SIGTERM}


@dataclass(frozen=True)
class NightResult:
    run_id: int
    exit_code: int
    tasks: tuple[TaskSummary, ...]


@dataclass(frozen=True)
class NightParts:
    """What the CLI builds and the night uses; tests build their own."""

    config: Config
    model: Model
    store: Any  # runs.store.RunStore
    guards_factory: Callable[[], Sequence[Guard]]
    on_signal: SignalSink
    log: Any
    repo: Any  # the user's git.Repo, opened and checked once (repository.open_repo, check_base)
    context_window: int | None = None
    cancel: CancelToken = field(default_factory=CancelToken)
    now: Callable[[], datetime] = local_now
    # Raises StateError once the state dir's lock is no longer this night's (lock.StateLock.check_still_held).
    check_lock: Callable[[], None] = lambda: None
    # The fire time of the scheduled night this run is (`serve` passes it): begun again after a restart,
    # it goes on from what this state dir's runs since then did (tasks done, tokens spent).
    scheduled_for: datetime | None = None


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


class _Night:
    """State shared by the tasks of one night (possibly running in parallel)."""

    def __init__(self, parts: NightParts, run_id: int, state_id: str | None, repository_key: str, tasks_pool: ThreadPoolExecutor) -> None:
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
        deadline = parts.config.night.deadline
        # The night began at its fire time when `serve` names one (begun again after a restart, or late within
        # the grace): read from the restart, 06:30 already past meant tomorrow's, a day more of work.
        began = parts.now()
        if parts.scheduled_for is not None:
            # On the night's own clock: the fire time comes with a fixed offset (`--scheduled-for 01:30+01:00`), and
            # read on that, 06:30 with `timezone = "local"` was an hour off on the nights the clocks change.
            began = parts.scheduled_for.astimezone(began.tzinfo)
        at = deadline_after(_on_the_schedules_clock(began, parts.config), deadline) if deadline else None
        self.deadline = Deadline(at, parts.cancel, parts.now)
        if at is not None and at.tzinfo is timezone.utc and (unreadable := unreadable_tz()) is not None:
            # local_now's UTC for a TZ the C library cannot read: 06:30 was UTC's with nothing said (TZ=Europe/Pariss).
            self.log.warning("deadline_read_in_utc", tz=unreadable, deadline=deadline, at=at.isoformat(), why=_DEADLINE_IN_UTC)
        self._slowest_iteration_s = 0.0
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
        # Worktrees are made in task order, a little ahead of need: a task asks for its own
        # once its first request has left (the checkout overlaps that model call, and does not
        # compete with the other tasks' first requests for the CPU), and for the next task's,
        # which is then ready before that task starts. (Registering is serialised in Worktree.ensure.)
        self._worktree_maker = ThreadPoolExecutor(max_workers=parts.config.night.concurrency, thread_name_prefix="worktrees")
        self._repo = parts.repo
        self._worktrees: dict[str, Future[Worktree]] = {}
        # A worktree is made ahead, often before its task has a task run: the commits its making kept
        # (worktree_commits_kept) are told on the task's own log once it has one, for its task_run_id.
        self._task_logs: dict[str, Any] = {}
        self._commits_kept: dict[str, str] = {}
        self._not_asked = deque(parts.config.task)

    def lease_key(self, task: TaskConfig) -> str:
        return lease_key(task.name, self._repository_key)

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

    def worktree(self, task: TaskConfig) -> Worktree:
        """The task's worktree; asking for it also asks for the next task's."""
        with self._lock:
            while task.name not in self._worktrees:
                self._ask_for_next_worktree()
            self._ask_for_next_worktree()
        return self._worktrees[task.name].result()

    def ask_ahead(self, task: TaskConfig, task_run_id: int, log: Any) -> AskedAhead:
        """The model, with the task's first request already on its way (see orchestrator/ahead.py).
        `log`: the task's, bound to its name and `task_run_id`."""
        tool_names = offered(task.tools)
        messages = first_messages(task, self.parts.config.night, tool_names, self.notes, self.parts.context_window)
        return AskedAhead(self.parts.model, messages, schemas_of(tool_names), unused=functools.partial(self._unused_answer, task_run_id, log))

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

    def _ask_for_next_worktree(self) -> None:
        if not self._not_asked:
            return
        task, config = self._not_asked.popleft(), self.parts.config
        self._worktrees[task.name] = self._worktree_maker.submit(
            self._ensure_worktree, self.repo_path, self.state_dir, task.name, config.repo.base, config.repo.keep, repo=self._repo
        )

    def _ensure_worktree(self, *args: Any, **kwargs: Any) -> Worktree:
        """Worktree.ensure on the worktree maker's thread: what it logs is this night's, and carries its run_id
        as reference.md promises of every event while the run exists (worktree_commits_kept, its task's too)."""
        with structlog.contextvars.bound_contextvars(run_id=self.run_id):
            return Worktree.ensure(*args, on_commits_kept=self._commits_kept_on, **kwargs)

    def _commits_kept_on(self, task: str, branch: str) -> None:
        """Told by the worktree maker: logged now if the task has begun, else when it does (`task_began`)."""
        with self._lock:
            log = self._task_logs.get(task)
            if log is None:
                self._commits_kept[task] = branch
                return
        log.warning("worktree_commits_kept", branch=branch)

    def task_began(self, task: TaskConfig, log: Any) -> None:
        """The task has its task run (`log` is bound to it): what its worktree's making kept is told on it."""
        with self._lock:
            self._task_logs[task.name] = log
            branch = self._commits_kept.pop(task.name, None)
        if branch is not None:
            log.warning("worktree_commits_kept", branch=branch)

    def close(self) -> None:
        """After every task has ended: stop making worktrees nobody will use."""
        self._worktree_maker.shutdown(wait=True, cancel_futures=True)
        self.tell_commits_kept_untold()

    def tell_commits_kept_untold(self) -> None:
        """Commits kept for a task that never began (a second Ctrl-C, or its task run never written): told on
        the night's log, with the task's name and no task_run_id, so the kept branch is not found by chance."""
        with self._lock:
            untold, self._commits_kept = self._commits_kept, {}
        for task, branch in untold.items():
            self.log.warning("worktree_commits_kept", task=task, branch=branch)

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


# A task cancelled because another task's error ended the night (the run `crashed`) before it began,
# or before its next iteration.
NIGHT_CRASHED = "night_crashed"


def run_night(parts: NightParts) -> NightResult:
    """The night: its run recorded, every task run on a pool of `[night] concurrency` workers (task_night.run_task),
    and the run ended with its exit code once every task has (_ended). A second Ctrl-C, or an error out of a task
    (the run closed `crashed`), is raised on instead (_summaries)."""
    config, store = parts.config, parts.store
    state_id = state_identity(config.state_dir)
    repository = shared_repository_key(config, parts.repo)
    run_id = store.begin_run(
        config_path=str(config.source), pid=os.getpid(), host=socket.gethostname(), state_id=state_id, queued=_queue(config, repository)
    )
    pool = ThreadPoolExecutor(max_workers=config.night.concurrency, thread_name_prefix="task")
    night = _Night(parts, run_id, state_id, repository, pool)
    night.log.info("night_started", tasks=len(config.task), model=config.model.name, concurrency=config.night.concurrency)
    if hidden := withheld(os.environ):
        # Names only: a check that needs one fails, and this says why (a task's pass_env lets it through).
        night.log.info("secrets_withheld", names=hidden)
    futures = [pool.submit(run_task, night, task) for task in config.task]
    return _ended(night, _summaries(night, pool, futures))


def _summaries(night: _Night, pool: ThreadPoolExecutor, futures: Sequence[Future[Any]]) -> list[TaskSummary]:
    """Every task's summary, in the config's order, once all have ended; the pool and the worktree maker closed
    after (_closed). A first Ctrl-C cancels the night (SIGINT) and waits while its tasks roll back; a second
    abandons them (raised on). An error out of a task ends the night (_close_crashed), and is raised on."""
    abandoned = False  # a second Ctrl-C: the iterations in flight are left to the next night's recovery
    try:
        return _results(futures)
    except KeyboardInterrupt:
        if night.parts.cancel.cancelled:
            abandoned = True
            raise
        # Tasks run in worker threads; tell them, then wait while they roll back.
        night.parts.cancel.cancel("SIGINT")
        try:
            return _results(futures)
        except KeyboardInterrupt:
            abandoned = True
            raise
    except Exception as crash:
        try:
            _close_crashed(night, pool, crash)
        except KeyboardInterrupt:
            # A second Ctrl-C while the others end: abandoned as anywhere else. (Python 3.11's interrupted
            # join marks the threads finished, so the wait in `finally` returned at once; 3.13's does not.)
            abandoned = True
            raise
        raise
    finally:
        _closed(night, pool, abandoned=abandoned)


def _close_crashed(night: _Night, pool: ThreadPoolExecutor, crash: Exception) -> None:
    """A task died of something that is not the model's doing (a broken worktree, a bug). The other tasks end
    their iterations in flight and start no more (task_night.run_task); then the run says `crashed` instead of
    staying "running" in the morning report (unless the store itself is what broke), with the exit code the
    process leaves with (a bug's traceback: 1). A Ctrl-C while the others end is raised."""
    pool.shutdown(wait=True)
    with contextlib.suppress(StateError):
        night.parts.store.close_interrupted_run(night.run_id, exit_code=getattr(crash, "exit_code", 1))


def _closed(night: _Night, pool: ThreadPoolExecutor, *, abandoned: bool) -> None:
    """The night's deadline watcher, pool and worktree maker stopped: waited for, or, `abandoned`, left with
    their tasks not begun cancelled (what the worktree maker kept is told all the same)."""
    night.deadline.stop()
    pool.shutdown(wait=not abandoned, cancel_futures=abandoned)
    if abandoned:
        night.tell_commits_kept_untold()
    else:
        night.close()


def _ended(night: _Night, summaries: Sequence[TaskSummary]) -> NightResult:
    """The run recorded and told `cancelled`, with its signal's exit code, when a signal stopped the night, else
    `finished`, with the tasks' (_exit_code)."""
    cancel, store = night.parts.cancel, night.parts.store
    if cancel.cancelled and cancel.why in SIGNAL_EXIT_CODES:
        exit_code = SIGNAL_EXIT_CODES[cancel.why]
        store.finish_run(night.run_id, status="cancelled", exit_code=exit_code)
        night.log.info("night_cancelled", why=cancel.why, exit_code=exit_code)
    else:
        exit_code = _exit_code(summaries)
        store.finish_run(night.run_id, status="finished", exit_code=exit_code)
        night.log.info(
            "night_finished",
            exit_code=exit_code,
            succeeded=sum(s.outcome is TaskOutcome.SUCCEEDED for s in summaries),
            # Skipped as done already: not this run's success, but the exit code counts them as the night's.
            done_already=sum(s.reason in (DONE_ELSEWHERE, DONE_EARLIER_TONIGHT) for s in summaries),
            stopped_early=_stopped_early(night, summaries),
        )
    return NightResult(run_id=night.run_id, exit_code=exit_code, tasks=tuple(summaries))


def _stopped_early(night: _Night, summaries: Sequence[TaskSummary]) -> str | None:
    """What ended a finished night early (`night_finished`'s `stopped_early`): its stop, the deadline, the night's
    budget, or None."""
    return (
        night.parts.cancel.why
        # A task it refused before it came is `cancelled`, reason deadline, though its watcher never fired.
        or ("deadline" if any(summary.reason == "deadline" for summary in summaries) else None)
        # Likewise the budget: spent by a task's last answer (its submit committed) with nothing left to refuse,
        # it ended nothing early, and naming it sent the morning looking for work the budget had cut short.
        or (night.budget.why if any(summary.reason == night.budget.why for summary in summaries) else None)
    )


def _queue(config: Config, repository: str) -> list[dict[str, Any]]:
    """The night's tasks as its run records them at its start: a night killed before it began some
    leaves no row of theirs, and its recovery records those from this (RunStore.close_interrupted_run)."""
    return [{"name": task.name, "branch": branch_for(task.name), "work_key": work_key(repository, task)} for task in config.task]


def _results(futures: Sequence[Any]) -> list[TaskSummary]:
    return [summary_of(future) for future in futures]


def store_is_shared(config: Config) -> bool:
    """Whether other state dirs may share the run store: any but the default one, a SQLite file in the state dir,
    which is this state dir's alone."""
    return not any(file.is_relative_to(config.state_dir) for file in sqlite_files(config.store_url))


def shared_repository_key(config: Config, repo: Any = None) -> str:
    """repository_key in a store other state dirs may share; "" in this state dir's own (each task's start is
    spared asking). `repo`: the user's git.Repo, opened here only when needed if not given."""
    if not store_is_shared(config):
        return ""
    return repository_key(repo if repo is not None else open_repo(config.repo_path), config.repo.base)


def repository_key(repo: Any, base: str) -> str:
    """The repository's root commits below `base`: the same in every clone of it, and in no other repository."""
    return " ".join(sorted(repo.git.rev_list("--max-parents=0", base).split()))


def work_key(repository: str, task: TaskConfig) -> str:
    """A task's work across the workers sharing a store: its repository, name, prompt and check."""
    return hashlib.sha256("\0".join((repository, task.name, task.prompt, task.check)).encode()).hexdigest()[:32]


def _exit_code(summaries: Sequence[TaskSummary]) -> int:
    if any(s.reason == "model_unreachable" for s in summaries):
        return EXIT_MODEL_UNREACHABLE
    if summaries and all(counts_as_succeeded(s.outcome, s.reason) for s in summaries):
        return EXIT_OK
    return EXIT_TASKS_FAILED


__all__ = [
    # The night's own.
    "EXIT_OK",
    "EXIT_TASKS_FAILED",
    "EXIT_USAGE",
    "EXIT_MODEL_UNREACHABLE",
    "EXIT_SIGHUP",
    "EXIT_SIGINT",
    "EXIT_SIGTERM",
    "SIGNAL_EXIT_CODES",
    "NIGHT_CRASHED",
    "NightParts",
    "NightResult",
    "run_night",
    "shared_repository_key",
    "store_is_shared",
    "repository_key",
    "work_key",
    # One task's night's (orchestrator/task_night.py; its two "done already" reasons, records.py's), importable from here as before.
    "BRANCH_CHECKED_OUT",
    "DONE_EARLIER_TONIGHT",
    "DONE_ELSEWHERE",
    "FAILED_EARLIER_TONIGHT",
    "LEASE_POLL_S",
    "PARK_CORRECTION",
    "PARKED_EARLIER_TONIGHT",
    "TaskSummary",
]
