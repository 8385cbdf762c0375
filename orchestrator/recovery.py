"""Crash recovery: what a killed night left behind, put right before the next one starts.

Call `recover_interrupted` while holding the state lock (`orchestrator.lock`),
before any task starts. Under that lock no process of ours is using this state
dir, so every task worktree here is idle: an iteration still marked `running`
by a dead process is rolled back to its checkpoint and recorded `interrupted`
(not a struggle: no note, no blame). Any other uncommitted change in a worktree
is not the agent's (a person's review edits, most likely): it is kept on a
branch of its own, then the worktree is cleaned. One exception keeps committed work: if
the process died after committing but before recording it, the commit (which
passed the check) stays and the iteration is recorded `committed`.

In a run store several state dirs share (machines on one PostgreSQL), recovery
settles only this state dir's runs (`orchestrator.lock.state_identity`): holding
its lock proves them dead, without asking whether a pid lives. Another state
dir's runs, worktrees and leases are left alone: its own next night settles
them, and a lease it holds ends with its ttl. Runs recorded before state dirs
had names are judged as before, by host, pid and lease, and so are this state
dir's runs recorded under another host name (`recovery_survey.Survey.alive_elsewhere`).

This module is the order of the steps; each step is a module of its own.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from orchestrator import live_night
from orchestrator.config import Config
from orchestrator.dead_runs import close_dead_runs, iterations_maybe_at_work, release_dead_leases, settle_dead_iterations
from orchestrator.git_locks import remove_common_ref_lock
from orchestrator.idle_worktrees import clean_idle_worktrees
from orchestrator.killed_leftovers import clear_a_killed_nights_leftovers
from orchestrator.lock import state_identity
from orchestrator.owed_notes import write_owed_notes
from orchestrator.recovery_survey import Survey


def recover_interrupted(store: Any, config: Config, log: Any) -> list[Any]:
    """Settle every iteration and run left `running` by a dead process; returns the iterations settled."""
    # The store's clock: leases and heartbeats are written by it (the database's, on PostgreSQL).
    host, me, now = socket.gethostname(), os.getpid(), store.now()
    state_id = state_identity(config.state_dir)

    # First of all, before any command is stopped or worktree touched: the lock says no night of
    # this state dir runs, unless its file was removed under a live one. Asked again before each
    # step that would touch its work: met between two of its tasks, it holds no lease for a moment.
    def refuse_beside_a_live_night() -> None:
        live_night.refuse_beside_a_live_night(store, config.state_dir, state_id, host, me)

    refuse_beside_a_live_night()
    clear_a_killed_nights_leftovers(config, log)
    survey = Survey.taken(store, config, host=host, me=me, now=now, state_id=state_id)
    running = store.running_iterations()
    refuse_beside_a_live_night()
    if not iterations_maybe_at_work(store, survey, running):
        # Before any worktree is settled: keeping a person's edits makes a branch, which a stale lock refused.
        common = _common_dir(config)
        if common is not None:
            remove_common_ref_lock(common, log)
    settled = settle_dead_iterations(store, config, survey, running, log)
    refuse_beside_a_live_night()
    close_dead_runs(store, survey, settled.run_ids, log)
    write_owed_notes(store, config, state_id, log)
    release_dead_leases(store, survey.leases.values(), host, me, state_id, log)
    refuse_beside_a_live_night()
    clean_idle_worktrees(config, skip=settled.worktrees_settled | settled.maybe_at_work, log=log)
    return list(settled.iterations)


def _common_dir(config: Config) -> Path | None:
    """The git dir the repository's checkouts share (a linked worktree's `repo` names its main repository's); None
    where git cannot open it: the night's own checks say why, in their order."""
    import git

    try:
        return Path(git.Repo(config.repo_path).common_dir)
    except Exception:
        return None
