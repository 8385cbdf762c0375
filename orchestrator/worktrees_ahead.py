"""A night's worktrees, made in task order a little ahead of need, and the commits their making kept, told on the
log of the task they were kept for once it has one (`worktree_commits_kept`)."""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import structlog

from orchestrator.config import Config, TaskConfig
from orchestrator.worktree import Worktree


class WorktreesAhead:
    """Worktrees are made in task order, a little ahead of need: a task asks for its own once its first request
    has left (the checkout overlaps that model call, and does not compete with the other tasks' first requests for
    the CPU), and for the next task's, which is then ready before that task starts. (Registering is serialised in
    Worktree.ensure.)"""

    def __init__(
        self, config: Config, repo: Any, repo_path: Path, state_dir: Path, *, run_id: int, log: Any, cancel: Any = None,
    ) -> None:
        """`repo_path`, `state_dir`: the config's, resolved once for the night. `log`: the night's. `cancel`: the
        night's CancelToken, which stops a checkout under way (a task's lease lost does not: its token is a child)."""
        self._config, self._repo, self._repo_path, self._state_dir = config, repo, repo_path, state_dir
        self._run_id, self._log, self._cancel = run_id, log, cancel
        self._maker = ThreadPoolExecutor(max_workers=config.night.concurrency, thread_name_prefix="worktrees")
        self._lock = threading.Lock()
        self._worktrees: dict[str, Future[Worktree]] = {}
        # A worktree is made ahead, often before its task has a task run: the commits its making kept
        # (worktree_commits_kept) are told on the task's own log once it has one, for its task_run_id.
        self._task_logs: dict[str, Any] = {}
        self._commits_kept: dict[str, str] = {}
        self._not_asked = deque(config.task)

    def of(self, task: TaskConfig) -> Worktree:
        """The task's worktree; asking for it also asks for the next task's."""
        with self._lock:
            while task.name not in self._worktrees:
                self._ask_for_next()
            self._ask_for_next()
        return self._worktrees[task.name].result()

    def task_began(self, task: TaskConfig, log: Any) -> None:
        """The task has its task run (`log` is bound to it): what its worktree's making kept is told on it."""
        with self._lock:
            self._task_logs[task.name] = log
            branch = self._commits_kept.pop(task.name, None)
        if branch is not None:
            log.warning("worktree_commits_kept", branch=branch)

    def close(self) -> None:
        """After every task has ended: stop making worktrees nobody will use."""
        self._maker.shutdown(wait=True, cancel_futures=True)
        self.tell_commits_kept_untold()

    def tell_commits_kept_untold(self) -> None:
        """Commits kept for a task that never began (a second Ctrl-C, or its task run never written): told on
        the night's log, with the task's name and no task_run_id, so the kept branch is not found by chance."""
        with self._lock:
            untold, self._commits_kept = self._commits_kept, {}
        for task, branch in untold.items():
            self._log.warning("worktree_commits_kept", task=task, branch=branch)

    def _ask_for_next(self) -> None:
        if not self._not_asked:
            return
        task, config = self._not_asked.popleft(), self._config
        self._worktrees[task.name] = self._maker.submit(
            self._ensure, self._repo_path, self._state_dir, task.name, config.repo.base, config.repo.keep, repo=self._repo
        )

    def _ensure(self, *args: Any, **kwargs: Any) -> Worktree:
        """Worktree.ensure on the worktree maker's thread: what it logs is this night's, and carries its run_id
        as reference.md promises of every event while the run exists (worktree_commits_kept, its task's too)."""
        with structlog.contextvars.bound_contextvars(run_id=self._run_id):
            return Worktree.ensure(*args, on_commits_kept=self._commits_kept_on, cancel=self._cancel, **kwargs)

    def _commits_kept_on(self, task: str, branch: str) -> None:
        """Told by the worktree maker: logged now if the task has begun, else when it does (`task_began`)."""
        with self._lock:
            log = self._task_logs.get(task)
            if log is None:
                self._commits_kept[task] = branch
                return
        log.warning("worktree_commits_kept", branch=branch)
