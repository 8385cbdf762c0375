"""A night: every task through iterations until it succeeds or stops; up to N tasks at once.

Here is its outline: its run recorded, every task run on a pool of workers, waited for, and the run ended. What the
tasks share is `night_state.Night`'s (the worktrees it makes ahead, worktrees_ahead.py's); one task's night (its row,
its lease, its iterations, its waits for another worker's lease) is orchestrator/task_night.py's (its work under the
lease task_work.py's); how the night ends, and the exit codes that are `overnight run`'s public contract,
orchestrator/night_end.py's.
"""

from __future__ import annotations

import contextlib
import os
import socket
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Sequence

from orchestrator.cancel import CancelToken, local_now
from orchestrator.config import Config
from orchestrator.errors import StateError
from orchestrator.lock import state_identity
from orchestrator.night_end import NightResult, night_ended
from orchestrator.night_state import Night, deadline_at
from orchestrator.protocols import Guard, Model, SignalSink
from orchestrator.secrecy import withheld
from orchestrator.task_branches import branch_for
from orchestrator.task_night import TaskSummary, run_task, summary_of
from orchestrator.work_keys import shared_repository_key, work_key


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


def run_night(parts: NightParts) -> NightResult:
    """The night: its run recorded, every task run on a pool of `[night] concurrency` workers (task_night.run_task),
    and the run ended with its exit code once every task has (night_end.night_ended). A second Ctrl-C, or an error
    out of a task (the run closed `crashed`), is raised on instead (_summaries)."""
    config, store = parts.config, parts.store
    state_id = state_identity(config.state_dir)
    repository = shared_repository_key(config, parts.repo)
    deadline_instant = deadline_at(parts)
    run_id = store.begin_run(
        config_path=str(config.source), pid=os.getpid(), host=socket.gethostname(), state_id=state_id, queued=_queue(config, repository),
        deadline=deadline_instant,
    )
    pool = ThreadPoolExecutor(max_workers=config.night.concurrency, thread_name_prefix="task")
    night = Night(parts, run_id, state_id, repository, pool, deadline_instant)
    # `deadline`: the instant chosen (a run past 06:30 works to tomorrow's), on the clock it was read on.
    deadline = night.deadline.at.isoformat() if night.deadline.at is not None else None
    night.log.info("night_started", tasks=len(config.task), model=config.model.name, concurrency=config.night.concurrency, deadline=deadline)
    if hidden := withheld(os.environ):
        # Names only: a check that needs one fails, and this says why (a task's pass_env lets it through).
        night.log.info("secrets_withheld", names=hidden)
    futures = [pool.submit(run_task, night, task) for task in config.task]
    return night_ended(night, _summaries(night, pool, futures))


def _summaries(night: Night, pool: ThreadPoolExecutor, futures: Sequence[Future[Any]]) -> list[TaskSummary]:
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


def _close_crashed(night: Night, pool: ThreadPoolExecutor, crash: Exception) -> None:
    """A task died of something that is not the model's doing (a broken worktree, a bug). The other tasks end
    their iterations in flight and start no more (task_night.run_task); then the run says `crashed` instead of
    staying "running" in the morning report (unless the store itself is what broke), with the exit code the
    process leaves with (a bug's traceback: 1). A Ctrl-C while the others end is raised."""
    pool.shutdown(wait=True)
    with contextlib.suppress(StateError):
        night.parts.store.close_interrupted_run(night.run_id, exit_code=getattr(crash, "exit_code", 1))


def _closed(night: Night, pool: ThreadPoolExecutor, *, abandoned: bool) -> None:
    """The night's deadline watcher, pool and worktree maker stopped: waited for, or, `abandoned`, left with
    their tasks not begun cancelled (what the worktree maker kept is told all the same)."""
    night.deadline.stop()
    pool.shutdown(wait=not abandoned, cancel_futures=abandoned)
    if abandoned:
        night.worktrees.tell_commits_kept_untold()
    else:
        night.worktrees.close()


def _queue(config: Config, repository: str) -> list[dict[str, Any]]:
    """The night's tasks as its run records them at its start: a night killed before it began some
    leaves no row of theirs, and its recovery records those from this (RunStore.close_interrupted_run)."""
    return [{"name": task.name, "branch": branch_for(task.name), "work_key": work_key(repository, task)} for task in config.task]


def _results(futures: Sequence[Any]) -> list[TaskSummary]:
    return [summary_of(future) for future in futures]
