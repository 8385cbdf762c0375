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
dir's runs recorded under another host name (see `alive_elsewhere`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import shutil
import socket
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from orchestrator.commands import UNATTENDED_ENV, WORKTREE_GIT_ENV, base_environment, pid_alive, stop_marked_processes
from orchestrator.config import GIT_CONFIG_COPY, Config
from orchestrator.confinement import remove_abandoned_folders
from orchestrator.errors import StateError
from orchestrator.night import NIGHT_CRASHED, shared_repository_key
from orchestrator.leases import lease_key, owner_host_pid, owner_state_id, task_of_lease
from orchestrator.lock import LOCK_NAME, Holder, LockHeld, state_identity
from orchestrator.notes import NotesBook, header_reason, stamp
from orchestrator.records import KeptOutOfCommit
from orchestrator.secrecy import PassedSecrets, Redactor, passed_secrets
from orchestrator.shared_config import restore_config_copy
from orchestrator.gitdir import admin_dir, gitdir_link, is_worktree_of, linked_admin_dir
from orchestrator.git_errors import git_reason
from orchestrator.repository import open_repo
from orchestrator.task_branches import branch_for, kept_branch
from orchestrator.worktree import GIT_TIMEOUT_S, Worktree
from orchestrator.worktree_registration import forget_missing, repair_moved
from orchestrator.writable import make_writable

INTERRUPTED_CORRECTION = (
    "None needed: the process was killed while this iteration ran; its changes were rolled back to the checkpoint."
)
OWED_NOTE_EVIDENCE = (
    "Written by the next night's recovery from the run store: the night that ran this iteration was killed, "
    "or could not write notes.md, before this entry was written. The iteration's transcript has what happened."
)
_GIT_LOCKS = ("index.lock", "HEAD.lock")
# Where changes found in an idle worktree are kept: `git branch --list 'overnight-kept/*'`.
# Under the state dir: worktrees git could not read, moved here whole (they may hold a person's edits).
SET_ASIDE_DIR = "worktrees-set-aside"


def recover_interrupted(store: Any, config: Config, log: Any) -> list[Any]:
    """Settle every iteration and run left `running` by a dead process; returns the iterations settled."""
    # The store's clock: leases and heartbeats are written by it (the database's, on PostgreSQL).
    host, me, now = socket.gethostname(), os.getpid(), store.now()
    state_id = state_identity(config.state_dir)

    # First of all, before any command is stopped or worktree touched: the lock says no night of
    # this state dir runs, unless its file was removed under a live one. Asked again before each
    # step that would touch its work: met between two of its tasks, it holds no lease for a moment.
    def refuse_beside_a_live_night() -> None:
        _refuse_beside_a_live_night(store, config.state_dir, state_id, host, me)

    refuse_beside_a_live_night()
    _clear_a_killed_nights_leftovers(config, log)
    survey = _Survey.taken(store, config, host=host, me=me, now=now, state_id=state_id)
    running = store.running_iterations()
    refuse_beside_a_live_night()
    settled = _settle_dead_iterations(store, config, survey, running, log)
    refuse_beside_a_live_night()
    _close_dead_runs(store, survey, settled.run_ids, log)
    _write_owed_notes(store, config, state_id, log)
    _release_dead_leases(store, survey.leases.values(), host, me, state_id, log)
    refuse_beside_a_live_night()
    _clean_idle_worktrees(config, skip=settled.worktrees_settled | settled.maybe_at_work, log=log)
    return list(settled.iterations)


def _clear_a_killed_nights_leftovers(config: Config, log: Any) -> None:
    """What a killed night left besides its records: half-written temporary files, its commands still
    running, the git config its agent changed, the folders of its fences in /tmp."""
    _remove_stale_temp_files(config.state_dir, log)
    _stop_orphan_commands(config.worktrees_dir, log)  # before any worktree is rolled back under them
    # After the commands that may have changed it are stopped: the config a killed night's agent changed.
    restored = restore_config_copy(config.git_config_copy)
    if restored:
        log.warning("git_config_restored", path=restored)
    for folder in remove_abandoned_folders():
        log.info("agent_folder_removed", path=str(folder))


@dataclasses.dataclass(frozen=True)
class _Survey:
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
    def taken(cls, store: Any, config: Config, *, host: str, me: int, now: datetime, state_id: str) -> _Survey:
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


@dataclasses.dataclass(frozen=True)
class _IterationsSettled:
    """What `_settle_dead_iterations` did, for the steps after it."""

    iterations: tuple[Any, ...]  # as now recorded: `committed` or `interrupted`
    run_ids: frozenset[Any]  # the runs they were of: dead, so closed next
    worktrees_settled: frozenset[str]  # tasks whose worktree was settled with its iteration: not cleaned again
    maybe_at_work: frozenset[str]  # tasks whose iteration may still run: their worktree is not cleaned either


def _settle_dead_iterations(store: Any, config: Config, survey: _Survey, running: list[Any], log: Any) -> _IterationsSettled:
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
    return _IterationsSettled(tuple(settled), frozenset(dead_runs), frozenset(touched), frozenset(alive))


def _settle_dead_iteration(
    store: Any, config: Config, iteration: Any, run: Any, log: Any, settles_worktree: bool, stale_after: timedelta
) -> Any:
    """Roll a dead iteration's worktree back when `settles_worktree` (or find its commit there), record it
    `committed` or `interrupted`, and log `iteration_recovered`; returns the iteration as recorded."""
    # The agent's last possible write: its last model call's answer acted on (a check, a command).
    agent_done_by = store.on_this_hosts_clock(iteration.heartbeat_at or iteration.started_at) + stale_after
    made = _settle_worktree(config, iteration, log, agent_done_by=agent_done_by) if settles_worktree else None
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


def _close_dead_runs(store: Any, survey: _Survey, dead_runs: frozenset[Any], log: Any) -> None:
    """Close every run still marked running whose night is gone (`_Survey.run_has_ended`, or one an iteration
    just settled was of), logging `run_recovered`; another state dir's are left alone."""
    for run in store.running_runs():
        if survey.elsewhere(run):
            continue
        if run.id in dead_runs or survey.run_has_ended(store, run):  # known dead first: no process look-up
            # Its tasks it never began are in the morning's account too: `cancelled`, as a night records the
            # tasks it stops before they begin, and for the reason a crashed night's such tasks have.
            never_begun = store.close_interrupted_run(run.id, never_begun_reason=NIGHT_CRASHED)
            log.info("run_recovered", run_id=run.id, dead_pid=run.pid, dead_host=run.host, never_begun=never_begun)


def _refuse_beside_a_live_night(store: Any, state_dir: Path, state_id: str, host: str, me: int) -> None:
    """LockHeld (exit 75) if a night of this state dir still works on this host although we got its
    lock: `overnight.lock` was deleted under it (by a person, or a cleaner of "stale" lock files),
    and this run locked a new file. Recovering would stop that night's commands, roll its work back
    and free its leases; it notices the lock is gone at its next check and stops by itself.

    Known by a run of this state dir still marked running, or a task lease of it, whose process lives
    on this host, began before the run (or lease) was recorded, and still has the removed lock file
    open (Linux's /proc shows it; elsewhere, or for another user's process, its being alive is all
    there is to go by). Not its pid alone: a dead night's pid may now be another process's (in a
    container restarted under the same host name, within seconds). The run shows a night that has
    not taken a lease yet (it has just begun, or is writing its report); the lease, one whose run
    recovery has already closed by the time it asks again (the run is closed before recovery's last look)."""
    removed_lock = f"{os.path.realpath(state_dir / LOCK_NAME)} (deleted)"

    def live_night(pid: int, recorded: datetime) -> bool:
        return pid_alive(pid, recorded) and _has_open(pid, removed_lock)

    for run in store.running_runs():
        began = store.on_this_hosts_clock(run.started_at)
        if run.state_id == state_id and run.host == host and run.pid != me and live_night(run.pid, began):
            _refuse(state_dir, Holder(pid=run.pid, host=host, since=began), f"run {run.id}")
    now = store.now()
    for lease in store.leases():
        lease_host, pid = owner_host_pid(lease.owner)
        if owner_state_id(lease.owner) != state_id or lease_host != host or pid is None or pid == me or lease.expires_at <= now:
            continue
        taken = store.on_this_hosts_clock(lease.acquired_at)
        if live_night(pid, taken):
            _refuse(state_dir, Holder(pid=pid, host=host, since=taken), f"holding the lease of task {task_of_lease(lease.task)!r}")


def _has_open(pid: int, target: str) -> bool:
    """Whether process `pid` has a file open that the kernel names `target` (its /proc/<pid>/fd links);
    True where that cannot be seen: no /proc, or another user's process."""
    try:
        entries = os.listdir(f"/proc/{pid}/fd")
    except PermissionError:
        return True
    except OSError:
        return not os.path.isdir("/proc/self/fd")  # no /proc here; else the process has gone
    for entry in entries:
        with contextlib.suppress(OSError):  # closed meanwhile
            if os.readlink(f"/proc/{pid}/fd/{entry}") == target:
                return True
    return False


def _refuse(state_dir: Path, night: Holder, seen_by: str) -> None:
    path = state_dir / LOCK_NAME
    raise LockHeld(
        path,
        night,
        message=f"a night of this state dir still runs (pid {night.pid} on {night.host}, {seen_by}) though {path} "
        "was free: its lock file was removed? Left alone; run again once it has ended",
    )


def _write_owed_notes(store: Any, config: Config, state_id: str, log: Any) -> None:
    """The notes.md entries this state dir's ended nights still owe (see iteration._Finisher._noted),
    from what the store kept, each marked written after it is; one notes.md holds already (the night
    died, or its store failed, between the entry and the mark) is only marked."""
    notes = NotesBook(config.notes_path)
    owed = store.owed_notes(state_id)
    # Headers show the minute: an earlier night's entry for the same task, iteration number and reason
    # in that minute (a restart loop) reads the same. Entries so headed, past those the store knows
    # were written, are the owed ones that notes.md already holds.
    headed = Counter((entry.task, entry.iteration, entry.reason, entry.when) for entry in notes.entries()) if owed else Counter()
    for iteration in owed:
        ended = iteration.finished_at or iteration.started_at
        minute = ended.astimezone(timezone.utc).replace(second=0, microsecond=0)
        key = (iteration.task_name, iteration.number, header_reason(iteration.reason), stamp(ended))
        alike = (iteration.task_name, iteration.number, iteration.reason)
        known = store.notes_written_alike(state_id, *alike, minute, minute + timedelta(minutes=1)) if headed[key] else 0
        if headed[key] <= known:
            notes.append(
                task=iteration.task_name,
                iteration=iteration.number,
                reason=iteration.reason,
                correction=iteration.correction,
                evidence=OWED_NOTE_EVIDENCE,
                when=ended,
            )
            log.info(
                "note_recovered",
                run_id=store.run_of_task_run(iteration.task_run_id).id,
                task=iteration.task_name,
                task_run_id=iteration.task_run_id,
                iteration=iteration.number,
                iteration_id=iteration.id,
                reason=iteration.reason,
            )
        store.note_written(iteration.id)


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


def _settle_worktree(config: Config, iteration: Any, log: Any, *, agent_done_by: datetime) -> Any:
    """Roll the task's worktree back to the checkpoint; return the commit instead (a git.Commit, its dates read
    with it) if the iteration had committed, else None.

    What a person did there after the night died (after `agent_done_by`, the latest the dead iteration
    could have written) is theirs, as in a worktree no iteration ran in: commits they made on the
    branch stay on it (the next night builds on them), files they changed are kept on an
    `overnight-kept/` branch first. A worktree they detached to check the branch out elsewhere is
    left as it is (the night skips the task while they have it; the idle cleaning settles it after)."""
    import git

    path = config.worktrees_dir / iteration.task_name
    if not path.exists():
        return None  # the worktree lives on another host, or was never created
    _remove_git_locks(path, iteration.task_name, log)
    repo = git.Repo(config.repo_path)
    branch = branch_for(iteration.task_name)
    head = repo.heads[branch].commit.hexsha if branch in repo.heads else ""
    made = _iteration_commit_at(repo, head, iteration) if head and head != iteration.checkpoint else None
    if _of_a_vanished_repository(repo, path):  # the clone the dead night worked in is gone (a CI workspace)
        _settle_orphaned_worktree(config, repo, path, log)
        return made
    worktree = Worktree(path, branch, config.repo.keep)
    with contextlib.suppress(Exception):  # a worktree git cannot read is rebuilt below, as before
        if (elsewhere := worktree.held_elsewhere()) is not None:
            log.warning("worktree_not_rolled_back", task=iteration.task_name, why=f"its branch is checked out in {elsewhere}")
            return made
    target = made.hexsha if made is not None else iteration.checkpoint
    if head and head != target and _committed_after(repo, target, head, agent_done_by):
        target = head
        log.warning("worktree_commits_left", task=iteration.task_name, commit=head[:12])
    if _changed_after(worktree, agent_done_by):
        _keep_what_a_person_may_have_written(worktree, iteration.task_name, config, log, onto=target)
    try:
        worktree.rollback(target)
    except Exception as exc:  # a worktree too broken for git: rebuilt from its branch by the next night
        _remove_worktree(config, repo, path, log, why=f"{type(exc).__name__}: {exc}")
        if head and target != head:
            with contextlib.suppress(git.GitCommandError):  # a checkpoint this clone lacks: the branch stays
                repo.git.branch("-f", branch, target)
    return made


def _iteration_commit_at(repo: Any, head: str, iteration: Any) -> Any:
    """The commit (a git.Commit) this iteration made: `head`, or below commits a person added on it since
    (first parents, down to the checkpoint); None if it made none."""
    for commit in repo.iter_commits(head, first_parent=True, max_count=_PERSON_COMMITS_LOOKED_THROUGH):
        if commit.hexsha == iteration.checkpoint:
            break
        if _is_iteration_commit(repo, commit, iteration):
            return commit
    return None


# How many commits a person may have added on an iteration's commit for it still to be found.
_PERSON_COMMITS_LOOKED_THROUGH = 50


def _committed_after(repo: Any, base: str, head: str, moment: datetime) -> bool:
    """Whether a commit on `head` and not on `base` was made after `moment`: a person's, since the
    night died (the agent's own commits of the killed iteration are older)."""
    import git

    after = moment.timestamp()
    try:
        return any(commit.committed_date > after for commit in repo.iter_commits(f"{base}..{head}", max_count=1000))
    except git.GitCommandError:  # a checkpoint this clone lacks: nothing to tell them apart by
        return False


def _changed_after(worktree: Worktree, moment: datetime) -> bool:
    """Whether a file that differs from HEAD (not ignored, not `keep`) was written after `moment`;
    False when git cannot tell (the rollback then rebuilds the worktree, as it did)."""
    try:
        changed = worktree.uncommitted_paths()
    except Exception:
        return False
    after = moment.timestamp()
    for relative in changed:
        with contextlib.suppress(OSError):  # deleted: nothing there to keep
            if (worktree.path / relative.rstrip("/")).lstat().st_mtime > after:
                return True
    return False


def _is_iteration_commit(repo: Any, commit: Any, iteration: Any) -> bool:
    """`commit` is the one this iteration made (only ever after its check passed), on its checkpoint:
    right on it, or on commits the agent made on top of it (the commit keeps those, `Worktree.commit`)."""
    return (
        commit.author.name == "overnight"
        and commit.summary == f"overnight: {iteration.task_name} iteration {iteration.number}"
        and ([parent.hexsha for parent in commit.parents] == [iteration.checkpoint] or repo.is_ancestor(iteration.checkpoint, commit.hexsha))
    )


def _clean_idle_worktrees(config: Config, *, skip: set[str], log: Any) -> None:
    """Under the state lock nobody works in these: anything uncommitted is debris of a death.

    Only what overnight made is touched: worktrees of this repository, and what a
    `git worktree add` killed half way leaves (an empty folder, or one holding only its
    `.git` link). Anything else found there (a person's folder, another repository's
    checkout) is left as it is.
    """
    root = config.worktrees_dir
    if not root.is_dir():
        return
    repo = open_repo(config.repo_path)
    for path in sorted(p for p in root.iterdir() if p.name not in skip and p.is_dir() and not p.is_symlink()):
        repair_moved(repo, path)  # moved with the state dir: ours still, and what a person left there is kept
        if _of_a_vanished_repository(repo, path):
            _settle_orphaned_worktree(config, repo, path, log)
            continue
        link = linked_admin_dir(repo, path)
        if link is None or not is_worktree_of(repo, path):
            contents = [entry.name for entry in path.iterdir()]
            if not contents or (contents == [".git"] and link is not None):
                _remove_worktree(config, repo, path, log, why="creation was interrupted")
            else:
                log.warning("worktree_folder_kept", task=path.name, why="not a worktree of this repository: left as it is")
            continue
        _remove_git_locks(path, path.name, log)
        try:
            worktree = Worktree(path, branch_for(path.name), config.repo.keep)
            if worktree.held_elsewhere() is not None:
                continue  # detached for the person's review of the branch: the night skips the task (BranchCheckedOut)
            state = worktree.idle_state()
        except Exception as exc:  # a broken index, say: whether a person's edits are in it is unknown
            _set_aside(config, repo, path, link, log, why=git_reason(exc))
            continue
        if state == "clean":
            continue
        if state == "changed":  # files git ignores are nobody's work to keep (and keep_changes takes none)
            _keep_what_a_person_may_have_written(worktree, path.name, config, log)
        try:
            worktree.rollback("HEAD")
            log.info("worktree_cleaned", task=path.name)
        except Exception as exc:
            _remove_worktree(config, repo, path, log, why=f"{type(exc).__name__}: {exc}")


def _of_a_vanished_repository(repo: Any, path: Path) -> bool:
    """Whether `path` is a linked worktree whose repository is gone: its `.git` link names a registration
    that no longer exists, and this repository has none for it. A state dir outside a checkout that is
    cloned afresh each time (a CI workspace) finds its worktrees so; git could only say "already exists"."""
    link = gitdir_link(path)
    return (
        link is not None and link.parent.name == "worktrees" and not os.path.lexists(link)
        and admin_dir(path, Path(repo.common_dir)) is None
    )


def _settle_orphaned_worktree(config: Config, repo: Any, path: Path, log: Any) -> None:
    """A worktree of a vanished repository (`_of_a_vanished_repository`) goes, for the task's to be made
    anew: removed when it holds exactly the tip of the task's branch in this repository (taken up from
    where the earlier night pushed it), ignored files and `[repo] keep` paths aside; else set aside,
    since what else is in it (a person's edits, work never pushed) no branch here can hold."""
    why = "a worktree of a repository that is gone"
    if _holds_only_its_branch(repo, path, branch_for(path.name), config.repo.keep):
        _remove_worktree(config, repo, path, log, why=why, done=", holding its branch's tip")
    else:
        _set_aside(config, repo, path, gitdir_link(path) or path, log, why=why)


def _holds_only_its_branch(repo: Any, path: Path, branch: str, keep: tuple[str, ...]) -> bool:
    """Whether the files at `path` are `branch`'s tip in `repo` and nothing more (ignored files and `keep` aside):
    compared through an index of its own, git working on `path` as a work tree of `repo`."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="overnight-orphan-") as scratch:
        env = {
            **base_environment(), **UNATTENDED_ENV, **WORKTREE_GIT_ENV,
            "GIT_DIR": str(repo.common_dir), "GIT_WORK_TREE": str(path), "GIT_INDEX_FILE": os.path.join(scratch, "index"),
        }

        def git(*args: str) -> subprocess.CompletedProcess[bytes]:
            return subprocess.run(["git", *args], cwd=path, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=GIT_TIMEOUT_S)

        try:
            if git("read-tree", f"refs/heads/{branch}").returncode != 0:  # no such branch here: nothing to compare with
                return False
            git("update-index", "-q", "--refresh")
            if git("diff-files", "--quiet").returncode != 0:
                return False
            others = git("ls-files", "-z", "--others", "--exclude-standard", *(f"--exclude={pattern}" for pattern in keep))
        except (OSError, subprocess.TimeoutExpired):  # not known to hold only the branch: set aside, not removed
            return False
        return others.returncode == 0 and not others.stdout.strip(b"\0")


def _keep_what_a_person_may_have_written(worktree: Worktree, task: str, config: Config, log: Any, onto: str | None = None) -> None:
    """Changes in a worktree no iteration was running in are not the agent's: most likely a person's
    (the morning's review, edited where git lets the task branch be checked out). They are kept on
    a branch of their own before the worktree is cleaned for the night.

    A night killed after a check given `pass_env` wrote a passed value into a file (a `.env`, a log) and
    before the commit left that file there too: kept, it would reach a branch a person may push. It is
    left off the kept branch as an iteration's commit leaves it off the task's (`secret_kept_out_of_commit`); so are the
    agent's own commits above `onto` (what the worktree is rolled back to) when they hold one, folded in."""
    branch = kept_branch(task)
    message = f"Changes found in overnight's worktree of task {task} with no iteration running, kept before it was cleaned"
    # When they cannot be kept (StateError), cleaning would lose them: the night stops (exit 4), everything as it is.
    kept = worktree.keep_changes(
        branch, message, secrets=_passed_secrets_of(config, task), on_kept_out=lambda out: _log_kept_out(config, task, out, log), onto=onto,
    )
    if kept is not None:
        log.warning("worktree_changes_kept", task=task, branch=branch)


def _passed_secrets_of(config: Config, task: str) -> PassedSecrets | None:
    """The values the task's check gets through `pass_env`, read from this environment as the check would get
    them; None when it gets none. A task no longer in the config (removed, renamed) has no pass_env to read: any
    configured task's value may be what its last check wrote, so all of theirs are looked for."""
    configured = [each.pass_env for each in config.task if each.name == task] or [each.pass_env for each in config.task]
    names = sorted({name for pass_env in configured for name in pass_env})
    return passed_secrets(names) if names else None


def _log_kept_out(config: Config, task: str, kept: KeptOutOfCommit, log: Any) -> None:
    """`secret_kept_out_of_commit`, each path through the night's redaction (orchestrator/night.py): a file may be named after the value."""
    redact = Redactor.for_config(config)
    log.warning("secret_kept_out_of_commit", task=task, paths=[redact(path) for path in kept.paths], names=list(kept.names))


def _stop_orphan_commands(worktrees_dir: Path, log: Any) -> None:
    """Checks and agent commands a killed night started: each runs in its own session, so it
    outlives the night, and would go on writing into a worktree that is being rolled back
    (its files then committed by the next night). Found by the mark in their environment
    (orchestrator.commands.COMMAND_MARK); Linux's /proc, elsewhere nothing to do."""
    for group, worktree in stop_marked_processes(worktrees_dir.resolve(), below=True).items():
        # The group is the command's: it ran in a session of its own, led by the shell overnight started.
        log.warning("orphan_command_stopped", pid=group, worktree=worktree)


def _remove_git_locks(path: Path, task: str, log: Any) -> None:
    """Lock files a killed git left; they would make every later git command in the worktree fail."""
    gitdir = gitdir_link(path)
    if gitdir is None:
        return
    try:
        common = (gitdir / os.fsdecode((gitdir / "commondir").read_bytes()).strip()).resolve()
    except OSError:
        return
    candidates = [gitdir / name for name in _GIT_LOCKS]
    candidates.append(common / "refs" / "heads" / (branch_for(task) + ".lock"))
    initializing = gitdir / "locked"  # `git worktree add` killed half way
    if initializing.is_file() and initializing.read_text(encoding="utf-8", errors="replace").startswith("initializing"):
        candidates.append(initializing)
    for lock in candidates:
        if lock.exists():
            lock.unlink(missing_ok=True)
            log.info("git_lock_removed", task=task, path=str(lock))


def _set_aside(config: Config, repo: Any, path: Path, admin: Path, log: Any, why: str) -> None:
    """Move the files of a worktree git cannot read out of the night's way: they may hold a person's
    edits that no branch can keep now. `Worktree.ensure` then makes the task's worktree anew.

    The folder goes as plain files, its `.git` link removed: left in, it would name the new
    worktree's registration (same task, same name), and git run there would move the task's
    branch and index. The commit it was on is logged (`on`). On another disk than the state dir
    (a `worktrees` folder linked elsewhere), it is set aside beside itself instead.
    """
    on = _registered_head(repo, admin)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    aside = config.state_dir / SET_ASIDE_DIR / f"{path.name}-{stamp}"
    try:
        aside.parent.mkdir(exist_ok=True)
        try:
            path.rename(aside)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            aside = path.with_name(f"{path.name}.set-aside-{stamp}")
            path.rename(aside)
        (aside / ".git").unlink(missing_ok=True)
    except OSError as exc:
        raise StateError(f"cannot set aside the worktree {path}, which git cannot read ({why[:120]}): {exc.strerror or exc}") from exc
    forget_missing(Path(repo.common_dir), path)
    log.warning("worktree_set_aside", task=path.name, kept_at=str(aside), on=on, why=why[:200])


def _registered_head(repo: Any, admin: Path) -> str:
    """The commit a worktree's registration says it is on ("" when that cannot be read)."""
    try:
        head = (Path(admin) / "HEAD").read_text(encoding="utf-8", errors="replace").strip()
        ref = head.removeprefix("ref: ").strip()
        return repo.git.rev_parse("--verify", "--quiet", f"{ref}^{{commit}}") if ref != head else head
    except Exception:  # an unreadable registration: the files are what matters
        return ""


def _remove_worktree(config: Config, repo: Any, path: Path, log: Any, why: str, *, done: str = "") -> None:
    """Delete the worktree at `path` for its task's to be made anew (`done`: what the log adds when it goes).

    Files the agent made read-only (a folder it chmod'ed, Go's module cache) are made writable and the
    deletion tried once more. What still stays (an immutable file, another user's) is set aside whole:
    a folder left half deleted is no worktree git can add there again, nor one recovery would touch
    again, so the task would fail every night after.
    """
    shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        make_writable(path)
        shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        _set_aside(config, repo, path, gitdir_link(path) or path, log, why=f"{why[:150]}, which could not be removed whole")
        return
    forget_missing(Path(repo.common_dir), path)  # Worktree.ensure forgets it too, before it registers it again
    log.warning("worktree_removed", task=path.name, why=f"{why[:200]}{done}")


def _release_dead_leases(store: Any, leases: Any, host: str, me: int, state_id: str, log: Any) -> None:
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


def _remove_stale_temp_files(state_dir: Path, log: Any) -> None:
    """notes.md's and the git config copy's half-written temporary files: never renamed into place, so only debris."""
    for temporary in [*state_dir.glob(".notes.md.*.tmp"), *state_dir.glob(f".{GIT_CONFIG_COPY}.*.tmp")]:
        if temporary.is_dir() and not temporary.is_symlink():
            continue  # a folder so named is nobody's debris of ours (we write plain files): left as it is
        try:
            temporary.unlink(missing_ok=True)
        except OSError as exc:  # a state dir this user may not write in: one line (exit 4), not a traceback
            raise StateError(f"cannot remove {temporary}: {exc.strerror or exc}") from None
        log.info("temp_file_removed", path=str(temporary))

