"""A task's worktree that must go, removed or set aside whole, for `Worktree.ensure` to make it anew.

Never lost: files no branch can keep (a worktree git cannot read, what a deletion could not remove)
are moved out of the night's way, not deleted.
"""

from __future__ import annotations

import errno
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from orchestrator.branch_holders import head_file
from orchestrator.config import Config
from orchestrator.errors import StateError
from orchestrator.gitdir import gitdir_link
from orchestrator.worktree_registration import forget_missing
from orchestrator.writable import make_writable

# Under the state dir: worktrees git could not read, moved here whole (they may hold a person's edits).
SET_ASIDE_DIR = "worktrees-set-aside"


def set_aside(config: Config, repo: Any, path: Path, admin: Path, log: Any, why: str) -> None:
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
        head = head_file(Path(admin))
        ref = head.removeprefix("ref: ").strip()
        return repo.git.rev_parse("--verify", "--quiet", f"{ref}^{{commit}}") if ref != head else head
    except Exception:  # an unreadable registration: the files are what matters
        return ""


def remove_worktree(config: Config, repo: Any, path: Path, log: Any, why: str, *, done: str = "") -> None:
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
        set_aside(config, repo, path, gitdir_link(path) or path, log, why=f"{why[:150]}, which could not be removed whole")
        return
    forget_missing(Path(repo.common_dir), path)  # Worktree.ensure forgets it too, before it registers it again
    log.warning("worktree_removed", task=path.name, why=f"{why[:200]}{done}")
