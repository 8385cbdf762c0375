"""A task has one worker at a time: a lease in the run store, renewed by a heartbeat thread.

The lease lives in the shared database, so it holds across processes and
hosts. A worker that dies stops renewing; after `ttl_s` anyone may take the
task over. Recovery on the same host need not wait: it knows the pid is dead.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import uuid
from typing import Any

from orchestrator.errors import StateError

DEFAULT_TTL_S = 60.0


class LeaseHeld(Exception):
    """Another worker holds the task's lease."""

    def __init__(self, task: str, holder: str = "") -> None:
        super().__init__(f"task {task_of_lease(task)!r} is being worked on by {holder or 'another process'}")
        self.task = task
        self.holder = holder


def lease_key(task: str, repository: str = "") -> str:
    """The name a task's lease has in the store: the task's own, and in a store that other repositories'
    nights share too, with its repository's key (work_keys.repository_key) after an `@`, which task names
    cannot hold: two projects' tasks named `tests` are two tasks, one project's on several machines one."""
    if not repository:
        return task
    return f"{task}@{hashlib.sha256(repository.encode()).hexdigest()[:16]}"


def task_of_lease(key: str) -> str:
    """The task name in a lease's name."""
    return key.partition("@")[0]


def new_owner(state_id: str | None = None) -> str:
    """A lease owner name: host and pid say where, the nonce tells two keepers of one process apart,
    and the state dir's name (orchestrator.lock.state_identity) whose night took it."""
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    return f"{owner}:{state_id}" if state_id else owner


def owner_host_pid(owner: str) -> tuple[str, int | None]:
    host, _, rest = owner.partition(":")
    pid = rest.split(":", 1)[0]
    return host, int(pid) if pid.isdigit() else None


def owner_state_id(owner: str) -> str | None:
    """The state dir named in `owner`; None for an owner written before names were."""
    parts = owner.split(":")
    return parts[3] if len(parts) > 3 and parts[3] else None


class LeaseKeeper:
    """Holds the lease named `task` (lease_key) for a with-block, renewing it every ttl/3 seconds from a daemon thread.

    If a renewal finds the lease taken (this process stalled past the ttl),
    `lost` becomes true and `on_lost` is called once; the caller decides
    whether to cancel the iteration.
    """

    def __init__(self, store: Any, task: str, owner: str | None = None, ttl_s: float = DEFAULT_TTL_S, on_lost: Any = None, log: Any = None) -> None:
        self.store = store
        self.task = task
        self.owner = owner or new_owner()
        self.ttl_s = ttl_s
        self.on_lost = on_lost
        self.log = log
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "LeaseKeeper":
        if not self.store.acquire_lease(self.task, self.owner, self.ttl_s):
            holder = next((lease.owner for lease in self.store.leases() if lease.task == self.task), "")
            raise LeaseHeld(self.task, holder)
        self._thread = threading.Thread(target=self._renew_until_stopped, name=f"lease-{self.task}", daemon=True)
        self._thread.start()
        return self

    def still_held(self) -> bool:
        """Renew now and say whether the lease is still ours: asked before work is committed,
        since a stalled process (SIGSTOP, a frozen VM) may have lost it to another worker."""
        if self.lost.is_set():
            return False
        if self.store.renew_lease(self.task, self.owner, self.ttl_s):
            return True
        self.lost.set()
        self._log("lease_lost")
        return False

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl_s)
        try:
            self.store.release_lease(self.task, self.owner)
        except StateError as error:
            # Not fatal: the lease expires by itself after ttl_s.
            self._log("lease_release_failed", error=str(error))

    def _renew_until_stopped(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                renewed = self.store.renew_lease(self.task, self.owner, self.ttl_s)
            except StateError as error:
                # The database hiccuped; try again next beat, the ttl leaves two more chances.
                self._log("lease_renew_failed", error=str(error))
                continue
            if not renewed:
                self.lost.set()
                self._log("lease_lost")
                if self.on_lost is not None:
                    self.on_lost()
                return

    def _log(self, event: str, **fields: Any) -> None:
        if self.log is not None:
            self.log.warning(event, task=task_of_lease(self.task), owner=self.owner, **fields)
