"""Which runs and iterations recovery may settle: those of nights that are gone, told from live ones.

A run of this state dir is dead by the lock's word. Another state dir's is left alone. Runs recorded
before state dirs had names, and this state dir's runs recorded under another host name, are judged by
host, pid, lease and heartbeat. Every step that settles something asks the one `Survey`, taken before any.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

from orchestrator.config import Config
from orchestrator.leases import lease_key, owner_host_pid
from orchestrator.work_keys import shared_repository_key
from orchestrator.process_liveness import pid_alive


@dataclasses.dataclass(frozen=True)
class Survey:
    """What recovery tells dead runs and iterations from live ones by, taken once before it settles any:
    this host and process, the store's time, this state dir's name, and the task leases held then."""

    host: str
    me: int
    now: datetime
    state_id: str
    leases: dict[str, Any]  # by lease key (`lease_key`)
    repository: str  # `shared_repository_key`: a task's lease key holds it
    stale_after: timedelta  # a check and a model call's timeouts, and a minute

    @classmethod
    def taken(cls, store: Any, config: Config, *, host: str, me: int, now: datetime, state_id: str) -> Survey:
        """The survey as the store stands now (its leases read first, then the repository's key)."""
        leases = {lease.task: lease for lease in store.leases()}
        return cls(
            host, me, now, state_id, leases, repository=shared_repository_key(config),
            stale_after=timedelta(seconds=config.night.check_timeout_s + config.model.request_timeout_s + 60),
        )

    def ours(self, run: Any) -> bool:
        """A run of this state dir: we hold its lock, so it has ended."""
        return run.state_id == self.state_id and run.host == self.host

    def elsewhere(self, run: Any) -> bool:
        """Another state dir's run: left alone, its own next night settles it."""
        return run.state_id is not None and run.state_id != self.state_id

    # This state dir's runs recorded under another host name: a container or CI runner gets a new
    # one every night while its state dir stays on a volume, but a copy of the state dir on another
    # machine sharing the store would look the same. Judged as runs without a state dir's name
    # are: by their leases and heartbeats, never by the lock alone.
    def alive_elsewhere(self, run: Any) -> bool:
        return any(owner_host_pid(lease.owner) == (run.host, run.pid) and lease.expires_at > self.now for lease in self.leases.values())

    def iteration_has_ended(self, store: Any, iteration: Any, run: Any) -> bool:
        """Whether the process that ran `iteration` (of `run`) is gone: a run of ours is, by the lock's word;
        any other is asked by `_is_orphaned`."""
        began = store.on_this_hosts_clock(iteration.started_at)
        lease = self.leases.get(lease_key(iteration.task_name, self.repository))
        return self.ours(run) or _is_orphaned(iteration, began, run, lease, self.host, self.me, self.now, self.stale_after)

    def run_has_ended(self, store: Any, run: Any) -> bool:
        """Whether the night of `run` is gone: ours; or on this host, its process dead (or this one);
        or this state dir's, recorded under another host name, with no live lease (`alive_elsewhere`)."""
        on_this_host = run.host == self.host and (
            run.pid == self.me or not pid_alive(run.pid, store.on_this_hosts_clock(run.started_at))
        )
        moved_here = run.state_id == self.state_id and run.host != self.host and not self.alive_elsewhere(run)
        return self.ours(run) or on_this_host or moved_here


def _is_orphaned(
    iteration: Any, began: datetime, run: Any, lease: Any, host: str, me: int, now: datetime, stale_after: timedelta
) -> bool:
    """`began`: the iteration's start on this host's clock (a shared store's times are the database's)."""
    if run.host == host and (iteration.pid == me or not pid_alive(iteration.pid, began)):
        return True
    if lease is not None:
        lease_host, lease_pid = owner_host_pid(lease.owner)
        # Expired, or already taken over by another worker: the old one is gone.
        return lease.expires_at <= now or (lease_host, lease_pid) != (run.host, iteration.pid)
    # No lease to ask: another host's iteration is dead once it has been silent too long.
    heartbeat = iteration.heartbeat_at or iteration.started_at
    return run.host != host and now - heartbeat > stale_after
