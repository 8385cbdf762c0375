"""Lock files a killed git left in a task's worktree, removed before recovery runs git there: a dead
iteration's worktree and an idle one alike would otherwise fail at every git command, night after night.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

from orchestrator.gitdir import gitdir_link
from orchestrator.task_branches import branch_for

# A reftable stack's lock: one a killed git left fails every later update of the stack ("cannot lock references"). The
# repository's own stack holds its branches (a new task's too); a worktree's holds its HEAD, as HEAD.lock does on the
# files backend.
_STACK_LOCK = "reftable/tables.list.lock"
# The worktree's own.
_GIT_LOCKS = ("index.lock", "HEAD.lock", _STACK_LOCK)

# A live git holds the stack's lock for one update (a compaction at most): one younger than this may be a person's
# commit in their checkout, or a night's of another state dir, which no run store of ours shows.
_STACK_LOCK_HELD_AT_MOST_S = 60


def remove_git_locks(path: Path, task: str, log: Any) -> None:
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


def remove_common_ref_lock(common: Path, log: Any) -> None:
    """The lock a killed git left on the reftable stack of the repository whose git dir is `common`.

    Shared by every checkout of the repository, so removed only where `remove_git_locks` removes a worktree's: under
    the state lock, before any task starts, and only when no iteration of ours may still be at work (the caller's
    word), and only one older than any update holds it: a git holding it would have its update undone under it."""
    lock = common / _STACK_LOCK
    try:
        found = lock.lstat()
    except OSError:
        return
    # A time ahead of the clock (a copied repository, a clock set back) is no git at work now.
    if not stat.S_ISREG(found.st_mode) or 0 <= time.time() - found.st_mtime < _STACK_LOCK_HELD_AT_MOST_S:
        return
    lock.unlink(missing_ok=True)
    # An event of its own: `git_lock_removed` always names the task whose worktree it was in, and this is no task's.
    log.info("ref_stack_lock_removed", path=str(lock))
