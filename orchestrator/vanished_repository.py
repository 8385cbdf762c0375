"""Worktrees whose repository is gone: a state dir kept outside a checkout that is cloned afresh each
time (a CI workspace) finds them so, and git can neither use them nor add them again ("already exists").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from orchestrator.command_environment import worktree_git_environment
from orchestrator.config import Config
from orchestrator.gitdir import admin_dir, gitdir_link
from orchestrator.task_branches import branch_for
from orchestrator.worktree_git import GIT_TIMEOUT_S
from orchestrator.worktree_removal import remove_worktree, set_aside


def of_a_vanished_repository(repo: Any, path: Path) -> bool:
    """Whether `path` is a linked worktree whose repository is gone: its `.git` link names a registration
    that no longer exists, and this repository has none for it. A state dir outside a checkout that is
    cloned afresh each time (a CI workspace) finds its worktrees so; git could only say "already exists"."""
    link = gitdir_link(path)
    return (
        link is not None and link.parent.name == "worktrees" and not os.path.lexists(link)
        and admin_dir(path, Path(repo.common_dir)) is None
    )


def settle_orphaned_worktree(config: Config, repo: Any, path: Path, log: Any) -> None:
    """A worktree of a vanished repository (`of_a_vanished_repository`) goes, for the task's to be made
    anew: removed when it holds exactly the tip of the task's branch in this repository (taken up from
    where the earlier night pushed it), ignored files and `[repo] keep` paths aside; else set aside,
    since what else is in it (a person's edits, work never pushed) no branch here can hold."""
    why = "a worktree of a repository that is gone"
    if _holds_only_its_branch(repo, path, branch_for(path.name), config.repo.keep):
        remove_worktree(config, repo, path, log, why=why, done=", holding its branch's tip")
    else:
        set_aside(config, repo, path, gitdir_link(path) or path, log, why=why)


def _holds_only_its_branch(repo: Any, path: Path, branch: str, keep: tuple[str, ...]) -> bool:
    """Whether the files at `path` are `branch`'s tip in `repo` and nothing more (ignored files and `keep` aside):
    compared through an index of its own, git working on `path` as a work tree of `repo`."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="overnight-orphan-") as scratch:
        env = {
            **worktree_git_environment(),
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
