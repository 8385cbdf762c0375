"""Which other checkout holds a task's branch: has it checked out, or rebases or bisects it.

Git lets only one worktree have a branch (a person may override that: `checkout --ignore-other-worktrees`), and a
night's commit or rollback on a branch another checkout holds would move that checkout's branch under it: such a task
is skipped (`BranchCheckedOut`), its worktree untouched.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from orchestrator.files import read_regular_file
from orchestrator.gitdir import branches_held_by_operations, checkouts
from orchestrator.ref_storage import REFTABLE_HEAD, RefsUnreadable, head_asked, is_reftable

# More than any HEAD git writes ("ref: refs/heads/<name>", or a commit's id).
_HEAD_MOST_READ = 4096


def head_file(admin: Path) -> str:
    """What the worktree's HEAD file holds ("ref: refs/heads/<branch>", or a commit when detached); "" if unreadable.
    Read only as a regular file: a pipe the agent put there held the commit for ever, waiting for a writer.
    A reftable repository's HEAD file holds only a placeholder: there git is asked (only there: the placeholder
    written into a files repository's HEAD is what that HEAD holds, no git process), and RefsUnreadable when git
    cannot read it: no checkout is taken to be off a branch it may hold."""
    try:
        held = read_regular_file(admin / "HEAD", _HEAD_MOST_READ).decode("utf-8", errors="replace").strip()
    except OSError:
        return ""
    # The admin folder itself tells (a linked worktree's has its own `reftable/` stack): its `commondir` is not read.
    return head_asked(admin) if held == REFTABLE_HEAD and is_reftable(admin) else held


def held_elsewhere(git: Callable[..., str], path: Path, admin: Path, common: Path, branch: str) -> str | None:
    """The folder of another worktree than the one at `path` that has `branch` checked out, or is rebasing or
    bisecting it (git shows such a worktree detached), while this one's HEAD is off it (git lets only one have it).
    A file read when HEAD is on the branch."""
    if head_file(admin) == f"ref: refs/heads/{branch}":
        return None
    wanted = f"branch refs/heads/{branch}"
    for block in git("worktree", "list", "--porcelain", "-z").split("\0\0"):
        lines = block.strip("\0").split("\0")
        folder = lines[0].removeprefix("worktree ") if lines and lines[0].startswith("worktree ") else ""
        if wanted in lines and folder and os.path.realpath(folder) != os.path.realpath(path):
            return folder
    return held_by_an_operation(admin, common, branch)


def also_held_elsewhere(admin: Path, common: Path, branch: str) -> str | None:
    """While the worktree's HEAD is on `branch`: another checkout whose HEAD is on it too, or that rebases or
    bisects it. File reads only (this runs at every task's start)."""
    wanted = f"ref: refs/heads/{branch}"
    for other, folder in checkouts(common, exclude=admin):
        try:
            # A registration whose folder was deleted (not yet pruned) holds nothing for anyone;
            # a locked one (on a disk not mounted now) still holds it, as git says.
            gone = not folder.is_dir() and not (other / "locked").exists()
            # `gone` first: in a reftable repository head_file is a git process.
            if not gone and head_file(other) == wanted:
                return str(folder)
        except OSError:
            continue
        except RefsUnreadable:
            if other == common:
                raise  # the repository's own stack, its branches' too: nothing of the night's can be read
            # Another registration's own stack: git writes its HEAD there last (`git worktree add` of another night or a
            # person, under way), and git itself takes a HEAD it cannot read as holding no branch.
            continue
    return held_by_an_operation(admin, common, branch)


def held_by_an_operation(admin: Path, common: Path, branch: str) -> str | None:
    """Another worktree than `admin`'s that rebases or bisects `branch` (git shows it detached), or None."""
    busy = branches_held_by_operations(common, exclude=admin)
    if branch in busy:
        folder, doing = busy[branch]
        return f"{folder} (a {doing} in progress)"
    return None
