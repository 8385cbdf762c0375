"""What the run store still says of a dead night, settled: its iterations left `running` recorded
`committed` or `interrupted` (their worktrees settled with them), its runs closed, its leases freed.

Runs and iterations are settled when the survey (`recovery_survey.Survey`) finds their night gone;
leases, when their owner's name says so.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone
from typing import Any

from orchestrator.config import Config
from orchestrator.interrupted_worktree import settle_worktree
from orchestrator.leases import owner_host_pid, owner_state_id, task_of_lease
from orchestrator.night_state import NIGHT_CRASHED
from orchestrator.process_liveness import pid_alive
from orchestrator.recovery_survey import Survey

INTERRUPTED_CORRECTION = (
    "None needed: the process was killed while this iteration ran; its changes were rolled back to the checkpoint."
)


@dataclasses.dataclass(frozen=True)
class IterationsSettled:
    """What `settle_dead_iterations` did, for the steps after it."""

    iterations: tuple[Any, ...]  # as now recorded: `committed` or `interrupted`
    run_ids: frozenset[Any]  # the runs they were of: dead, so closed next
    worktrees_settled: frozenset[str]  # tasks whose worktree was settled with its iteration: not cleaned again
    maybe_at_work: frozenset[str]  # tasks whose iteration may still run: their worktree is not cleaned either


def settle_dead_iterations(store: Any, config: Config, survey: Survey, running: list[Any], log: Any) -> IterationsSettled:
    """Each iteration of `running` (those the store has `running`) whose process is gone, settled
    (`_settle_dead_iteration`); another state dir's are left alone, and those perhaps still at work noted."""
    settled, dead_runs, touched, alive = [], set(), set(), set()
    for iteration in running:
        run = store.run_of_task_run(iteration.task_run_id)
        if survey.elsewhere(run):
            continue
        if not survey.iteration_has_ended(store, iteration, run):
            alive.add(iteration.task_name)  # perhaps still at work: its worktree is not cleaned either
            continue
        # Another host's run that predates state dir names (an older version's, in a shared store):
        # its worktree is on that host; this state dir's worktree of the same task is not its own.
        settles_worktree = run.state_id is not None or run.host == survey.host
        settled.append(_settle_dead_iteration(store, config, iteration, run, log, settles_worktree, survey.stale_after))
        dead_runs.add(run.id)
        if settles_worktree:  # else the worktree is left to the idle cleaning, which keeps a person's edits
            touched.add(iteration.task_name)
    return IterationsSettled(tuple(settled), frozenset(dead_runs), frozenset(touched), frozenset(alive))


def iterations_maybe_at_work(store: Any, survey: Survey, running: list[Any]) -> bool:
    """Whether any of `running` may still be at work in this host's checkouts: one `settle_dead_iterations` would leave
    running, or another state dir's whose process lives on this host (left alone, its night may work in this same
    repository). What the repository's checkouts share (its reftable stack's lock) is then not touched."""
    return any(
        _elsewhere_alive_here(store, survey, run) if survey.elsewhere(run) else not survey.iteration_has_ended(store, iteration, run)
        for iteration in running
        for run in (store.run_of_task_run(iteration.task_run_id),)
    )


def _elsewhere_alive_here(store: Any, survey: Survey, run: Any) -> bool:
    # Another machine's night (a store several machines share) works in its own clone, never in this one's git dir:
    # counted, it kept a stale lock for as long as any worker anywhere was mid-iteration.
    return run.host == survey.host and pid_alive(run.pid, store.on_this_hosts_clock(run.started_at))


def _settle_dead_iteration(
    store: Any, config: Config, iteration: Any, run: Any, log: Any, settles_worktree: bool, stale_after: timedelta
) -> Any:
    """Roll a dead iteration's worktree back when `settles_worktree` (or find its commit there), record it
    `committed` or `interrupted`, and log `iteration_recovered`; returns the iteration as recorded."""
    # The agent's last possible write: its last model call's answer acted on (a check, a command).
    agent_done_by = store.on_this_hosts_clock(iteration.heartbeat_at or iteration.started_at) + stale_after
    began = store.on_this_hosts_clock(iteration.started_at)
    made = settle_worktree(config, iteration, log, agent_began_at=began, agent_done_by=agent_done_by) if settles_worktree else None
    if made is not None:
        view = _record_committed(store, iteration, made.hexsha, _seen_committing(store, iteration, made, agent_done_by))
    else:
        view = _record_interrupted(store, iteration)
    log.info(
        "iteration_recovered",
        run_id=run.id,
        task=iteration.task_name,
        task_run_id=iteration.task_run_id,
        iteration=iteration.number,
        iteration_id=iteration.id,
        outcome=view.outcome,
        checkpoint=iteration.checkpoint[:12],
        dead_pid=iteration.pid,
        dead_host=run.host,
    )
    return view


def _seen_committing(store: Any, iteration: Any, made: Any, agent_done_by: datetime) -> datetime:
    """When the dead iteration was last seen alive, on the store's clock: when its commit `made` (a git.Commit)
    was made (its check and commit came after its last heartbeat, its last model call), never before that
    heartbeat nor past `agent_done_by` (a clock set wrong) or now; not recovery's own time, the next night's. When
    it was made: the earlier of its committer and author dates, as a person's amend (or rebase) of it since dates
    its committer anew but keeps its author date."""
    heartbeat = iteration.heartbeat_at or iteration.started_at
    committed = min(made.committed_datetime, made.authored_datetime)
    # Measured from the heartbeat on this host's clock, the commit's: a shared store's clock may differ.
    later_by = min(committed, agent_done_by, datetime.now(timezone.utc)) - store.on_this_hosts_clock(heartbeat)
    return heartbeat + max(later_by, timedelta(0))


def _record_committed(store: Any, iteration: Any, commit: str, ended: datetime) -> Any:
    """The iteration died after committing `commit` but before recording it: recorded `committed`, its task
    succeeded; it ended at `ended` (the store's clock), so its run does too (`RunStore._last_seen_alive`)."""
    store.finish_iteration(
        iteration.id, outcome="committed", commit=commit, turns=iteration.turns, tokens=iteration.tokens, at=ended
    )
    # Its run may have closed the task as interrupted already: the store failed as the commit was
    # recorded and came back for the run's own end. The branch holds the work: the task succeeded.
    store.succeed_interrupted_task(iteration.task_run_id, commit)
    return dataclasses.replace(iteration, outcome="committed", commit=commit, finished_at=ended, heartbeat_at=ended)


def _record_interrupted(store: Any, iteration: Any) -> Any:
    """The iteration died before committing: recorded `interrupted` (not a struggle: no note, no blame)."""
    store.interrupt_iteration(iteration.id, correction=INTERRUPTED_CORRECTION)
    return dataclasses.replace(iteration, outcome="interrupted", reason="interrupted", correction=INTERRUPTED_CORRECTION)


def close_dead_runs(store: Any, survey: Survey, dead_runs: frozenset[Any], log: Any) -> None:
    """Close every run still marked running whose night is gone (`Survey.run_has_ended`, or one an iteration
    just settled was of), logging `run_recovered`; another state dir's are left alone."""
    for run in store.running_runs():
        if survey.elsewhere(run):
            continue
        if run.id in dead_runs or survey.run_has_ended(store, run):  # known dead first: no process look-up
            # Its tasks it never began are in the morning's account too: `cancelled`, as a night records the
            # tasks it stops before they begin, and for the reason a crashed night's such tasks have.
            never_begun = store.close_interrupted_run(run.id, never_begun_reason=NIGHT_CRASHED)
            log.info("run_recovered", run_id=run.id, dead_pid=run.pid, dead_host=run.host, never_begun=never_begun)


def release_dead_leases(store: Any, leases: Any, host: str, me: int, state_id: str, log: Any) -> None:
    """Leases of this state dir's dead nights (and, for owners without a state dir's name, of
    dead processes on this host): free now rather than after their ttl. A pid alone does not
    say a process is dead: another pid namespace (a container) under the same host name
    reuses it."""
    for lease in leases:
        lease_host, lease_pid = owner_host_pid(lease.owner)
        owner_state = owner_state_id(lease.owner)
        if owner_state is not None:
            dead = owner_state == state_id and lease_host == host
        else:
            dead = lease_host == host and lease_pid is not None and (lease_pid == me or not pid_alive(lease_pid))
        if dead:
            store.release_lease(lease.task, lease.owner)
            log.info("lease_released", task=task_of_lease(lease.task), dead_owner=lease.owner)
