"""A repository a person put where a task's worktree goes: never adopted as the task's worktree.

A task's worktree folder deleted by hand without `git worktree prune` stays registered, and a person's clone (or
`git init`) made there since holds a `.git` folder of its own; a repository copied with `cp -r` registers the
original's worktrees too, whose `.git` links still name the original's git dir. Adopted through the registration,
the night's `.git` link replaced the clone's history, or took the original's worktree and rolled back the edits there.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from orchestrator.dot_git import DotGitKind, dot_git
from orchestrator.errors import ConfigError
from orchestrator.gitdir import common_of
from orchestrator.task_branches import BranchCheckedOut


class WorktreeFolderTaken(BranchCheckedOut):
    """Another repository, or another repository's worktree, is where the task's worktree goes: the task is
    skipped (as when its branch is checked out elsewhere), the folder left as it is."""

    def __init__(self, task: str, at: Path, what: str) -> None:
        # Not BranchCheckedOut's message: no checkout is to be switched away, a folder is to be moved.
        ConfigError.__init__(
            self,
            f"task {task!r}: {at} is {what}, not the task's worktree: left as it is; move it elsewhere "
            "(and run `git worktree prune`) and the next night makes the task's worktree anew",
        )
        self.at = str(at)
        self.what = what


def refuse_a_foreign_repository(path: Path, common: Path, task: str) -> None:
    """WorktreeFolderTaken when `path/.git` is a repository of its own (a folder), or a link naming a git dir, still
    there, of a repository other than the one at `common`. A link naming a git dir that is gone (the repository
    moved) is relinked, and a missing `.git` put back, as before."""
    found = dot_git(path)
    ours = common.resolve()
    if found.kind is DotGitKind.FOLDER and found.gitdir.resolve() != ours:
        raise WorktreeFolderTaken(task, path, "a repository of its own (its .git is a folder)")
    if found.kind is DotGitKind.LINK and common_of(found.gitdir) != ours:
        raise WorktreeFolderTaken(task, path, f"a worktree of another repository ({common_of(found.gitdir)})")


# The iteration's start as recorded, read on this host's clock, may be this much after the agent's first write.
_START_SLACK_S = 2.0


def is_a_repository_of_its_own(path: Path) -> bool:
    """Whether `path/.git` is a folder (not a link file, not a symlink)."""
    return dot_git(path).kind is DotGitKind.FOLDER


def made_while_the_agent_ran(path: Path, began: datetime, done_by: datetime) -> bool:
    """Whether the repository `path/.git` (a folder) was made by a dead iteration's agent (`git init` in its worktree):
    its oldest entry came between the iteration's start and the agent's last possible write. Its ctime, which the kernel
    sets and no tool sets back: a person's clone made there after the night died is newer, one moved in (`mv` keeps
    what it holds) older."""
    dotgit = path / ".git"
    try:
        with os.scandir(dotgit) as entries:
            oldest = min([dotgit.lstat().st_ctime, *(entry.stat(follow_symlinks=False).st_ctime for entry in entries)])
    except OSError:
        return False
    return began.timestamp() - _START_SLACK_S <= oldest <= done_by.timestamp()
