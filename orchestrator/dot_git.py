"""What a folder's `.git` is, and where it points: told from one `lstat` and, for a link file, one small read.

The night's refusal of a repository where a task's worktree goes (foreign_checkout.py) and recovery's relinking of a
worktree whose repository moved (idle_worktrees.py) judge the same folders: read in one place, they cannot disagree on
which link names a git dir still there (one took a link naming a file for gone, the other for there).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from orchestrator.gitdir import gitdir_link


class DotGitKind(Enum):
    MISSING = "missing"  # no `.git`, or none that can be looked at
    FOLDER = "folder"  # a repository of its own (a folder, not a symlink to one)
    LINK = "link"  # a link file (`gitdir: …`) naming a git dir that is there: a folder
    LINK_TO_GONE = "link to gone"  # a link file naming a git dir no longer there (the repository moved, or was deleted)
    NO_LINK = "no link"  # a regular file that is no link file (garbage the agent wrote over its link)
    OTHER = "other"  # a symlink, anything else: left to the caller as it was


@dataclass(frozen=True)
class DotGit:
    kind: DotGitKind
    gitdir: Path | None = None  # the git dir: `.git` itself for FOLDER, the one named (relative: to the folder) for links


def dot_git(path: Path) -> DotGit:
    """What `path/.git` is, read without following a symlink."""
    dotgit = path / ".git"
    try:
        mode = os.lstat(dotgit).st_mode
    except OSError:
        return DotGit(DotGitKind.MISSING)
    if stat.S_ISDIR(mode):
        return DotGit(DotGitKind.FOLDER, dotgit)
    if not stat.S_ISREG(mode):
        return DotGit(DotGitKind.OTHER)
    gitdir = gitdir_link(path)
    if gitdir is None:
        return DotGit(DotGitKind.NO_LINK)
    # os.path.isdir, not Path.is_dir: that raises (Python 3.11, 3.12) for a name no file can have (too long) or one under
    # a folder this user cannot search, where no git dir is seen either; a `.git` the agent wrote so stopped recovery.
    return DotGit(DotGitKind.LINK if os.path.isdir(gitdir) else DotGitKind.LINK_TO_GONE, gitdir)
