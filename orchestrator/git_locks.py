"""Lock files a killed git left in a task's worktree, removed before recovery runs git there: a dead
iteration's worktree and an idle one alike would otherwise fail at every git command, night after night.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from orchestrator.gitdir import gitdir_link
from orchestrator.task_branches import branch_for

# The worktree's own: in a reftable repository its HEAD lives in the worktree's `reftable/` stack, whose lock a killed
# commit left fails every later one ("cannot lock references"), as HEAD.lock does on the files backend.
_GIT_LOCKS = ("index.lock", "HEAD.lock", "reftable/tables.list.lock")


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
