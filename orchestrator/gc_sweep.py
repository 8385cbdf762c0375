"""One `overnight gc` over the stale tasks: their worktrees removed first, then their branches, each kept one with why."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config import Config
from orchestrator.gc_git import GcGit, GcGitFailed
from orchestrator.gc_keep import base_label, last_commit, operation_in_progress, why_keep_unnamed, why_keep_worktree, why_unsafe
from orchestrator.gitdir import admin_dir, branches_held_by_operations
from orchestrator.task_branches import BRANCH_PREFIX
from orchestrator.writable import make_writable


@dataclass(frozen=True)
class KeptBranch:
    branch: str
    reason: str


@dataclass(frozen=True)
class KeptWorktree:
    path: Path
    reason: str


@dataclass(frozen=True)
class Sweep:
    """One gc over the stale tasks: their worktrees first, then their branches."""

    git: GcGit
    common: Path
    config: Config
    force: bool
    dry_run: bool

    def worktrees(
        self, stale: list[str], ours: dict[str, Path], detached: dict[str, tuple[Path, str]], locks: dict[Path, str]
    ) -> tuple[list[Path], list[KeptWorktree], dict[str, str]]:
        """The stale tasks' worktrees removed (in a dry run: that would be), those kept with why, and
        where each kept one on its task's branch has that branch checked out (by branch)."""
        removed: list[Path] = []
        kept: list[KeptWorktree] = []
        kept_on_branch: dict[str, str] = {}
        for name in stale:
            path = ours.get(name) or detached.get(name, (None, ""))[0]
            if path is None:
                continue
            why_kept = self._why_keep_stale_worktree(name, path, ours, detached, locks)
            if why_kept is None and not self.dry_run:
                why_kept = _remove_worktree(self.git, path, self.common)
            if why_kept:
                kept.append(KeptWorktree(path, why_kept))
                if name in ours:
                    kept_on_branch[BRANCH_PREFIX + name] = str(path)
                continue
            removed.append(path)
        return removed, kept, kept_on_branch

    def _why_keep_stale_worktree(
        self, name: str, path: Path, ours: dict[str, Path], detached: dict[str, tuple[Path, str]], locks: dict[Path, str]
    ) -> str | None:
        """Why the stale task `name`'s worktree at `path` must stay (the same answer in a dry run), or None."""
        git, common, force = self.git, self.common, self.force
        # On a deleted branch (HEAD unborn), its changes are those since the commit it was last on.
        last = last_commit(git, path, common) if name in ours and git.resolve(f"refs/heads/{BRANCH_PREFIX}{name}") is None else None
        why_kept = why_keep_worktree(path, BRANCH_PREFIX + name, locks, self.config.repo.keep, common, force, last)
        if why_kept is None and last and not force:
            why_kept = why_keep_unnamed(git, path, last, "its branch was deleted and its last commit")
        if why_kept is None and name in detached:
            # A rebase stopped at an `edit` shows its worktree detached: --force does not end it.
            why_kept = operation_in_progress(path, common)
            if why_kept is None and not force:
                why_kept = why_keep_unnamed(git, path, detached[name][1], "its detached HEAD")
        return why_kept

    def branches(self, stale: list[str], checked_out: dict[str, str]) -> tuple[list[str], list[KeptBranch]]:
        """The stale tasks' branches deleted (in a dry run: that would be) and those kept, with why.
        `checked_out`: where a worktree has each branch checked out, by branch."""
        busy = branches_held_by_operations(self.common)
        removed: list[str] = []
        kept: list[KeptBranch] = []
        base_ref = self.git.symbolic_ref(self.config.repo.base)
        base_name = base_label(self.config.repo.base, base_ref)
        base_branch = base_ref.removeprefix("refs/heads/") if base_ref.startswith("refs/heads/") else None
        for name in stale:
            branch = BRANCH_PREFIX + name
            tip = self.git.resolve(f"refs/heads/{branch}")
            if tip is None:
                continue
            why_kept = self._why_branch_is_held(branch, checked_out, busy, base_branch)
            if why_kept is None:
                why_kept = self._delete_branch(branch, tip, base_name, removed)
            if why_kept:
                kept.append(KeptBranch(branch, why_kept))
                continue
            removed.append(branch)
        return removed, kept

    def _why_branch_is_held(
        self, branch: str, checked_out: dict[str, str], busy: dict[str, tuple[Path, str]], base_branch: str | None
    ) -> str | None:
        """Why `branch` must stay whatever its commits: a worktree, `[repo] base` or a git operation holds it; or None."""
        if branch in checked_out:
            return f"checked out at {checked_out[branch]}"
        if branch == base_branch:  # deleting it would leave every later night without its base
            return f"it is [repo] base ({self.config.repo.base})"
        if branch in busy:  # a rebase or bisect holds it, though that worktree's HEAD is detached
            return "checked out at {} (a {} in progress)".format(*busy[branch])
        return None

    def _delete_branch(self, branch: str, tip: str, base_name: str | None, removed: list[str]) -> str | None:
        """Delete `branch` at `tip` (not in a dry run) unless that loses a commit and not `force`: None
        when it is (or would be) deleted, else why it stays. `removed`: the branches deleted before it."""
        try:
            unsafe = None if self.force else why_unsafe(self.git, branch, tip, base_name, removed)
            if not unsafe and not self.dry_run:
                self.git.run("branch", "-D", "--quiet", branch)
        except GcGitFailed as failed:
            unsafe = failed.detail
        return unsafe


def _remove_worktree(git: GcGit, path: Path, common: Path) -> str | None:
    """Remove the worktree at `path`; None when done, else git's reason.

    Files the agent or a tool made read-only (Go's module cache) are made writable and the
    removal tried once more. git forgets the worktree before it fails on its files: the folder
    left then is deleted here.
    """
    try:
        git.run("worktree", "remove", "--force", str(path))
        return None
    except GcGitFailed as failed:
        first = failed.detail
    make_writable(path)
    try:
        if admin_dir(path, common) is not None:
            git.run("worktree", "remove", "--force", str(path))
        elif path.exists():
            shutil.rmtree(path)
    except (GcGitFailed, OSError):
        return first
    return None
