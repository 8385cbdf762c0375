"""`overnight gc`: remove the worktrees and branches of tasks that left the config.

A task's worktree is `<state dir>/worktrees/<task>` on `overnight/<task>` (or detached there,
when its HEAD commit is on some branch, tag or remote); gc removes no other worktree. One elsewhere, even on an `overnight/` branch, is the user's
(a review checkout, say): it and its branch are left alone, as are the main
worktree and every branch outside `overnight/`. A stale task's worktree is
removed when it holds no uncommitted change, since the branch then has all of
it and `Worktree.ensure` recreates it if the task comes back; one with changes
is kept unless `force` (one whose branch a person deleted counts its changes from
the commit it was last on, and is kept too while that commit's own are on no
other ref). The branch is deleted only when each of its commits is on another ref: merged into `[repo] base` (or another branch, or a tag) or on a
remote-tracking branch (pushed); a detached HEAD and `overnight-kept/*` branches do not count. A branch rebased
into base (each commit's change there byte for byte, whitespace included, as `git patch-id --verbatim`
tells; `git cherry` ignores whitespace) counts as merged, unless it has a merge commit of its own
(whose conflict resolution patch ids cannot see), or git is older than 2.39 (no `--verbatim`).
Otherwise it is kept, with the reason, unless `force`. The branch `[repo] base` names is
always kept, even merged: the next night starts from it. Transcripts, notes.md and the run
store keep their history.

The git it runs and reads is `gc_git.py`'s, the sweep over the stale tasks `gc_sweep.py`'s, and the reasons
to keep a worktree or branch `gc_keep.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.config import Config
from orchestrator.gc_git import GcGit, task_branches, worktrees
from orchestrator.gc_sweep import KeptBranch, KeptWorktree, Sweep
from orchestrator.repository import check_base, open_repo
from orchestrator.worktree_registration import repair_moved


@dataclass(frozen=True)
class GcResult:
    """What gc removed (or, with dry_run, would remove) and what it kept and why."""

    removed_worktrees: tuple[Path, ...] = ()
    removed_branches: tuple[str, ...] = ()
    kept_branches: tuple[KeptBranch, ...] = ()
    dry_run: bool = False
    kept_worktrees: tuple[KeptWorktree, ...] = ()

    def lines(self) -> list[str]:
        verb = "would remove" if self.dry_run else "removed"
        lines = [f"{verb} worktree {path}" for path in self.removed_worktrees]
        lines += [f"kept worktree {kept.path}: {kept.reason}" for kept in self.kept_worktrees]
        lines += [f"{verb} branch {branch}" for branch in self.removed_branches]
        lines += [f"kept branch {kept.branch}: {kept.reason}" for kept in self.kept_branches]
        return lines or ["nothing to collect"]


def collect_garbage(config: Config, *, force: bool = False, dry_run: bool = False) -> GcResult:
    """Remove worktrees and `overnight/` branches of tasks no longer in `config`.

    What git refuses for one worktree or branch (a lock, files that cannot be deleted, a branch
    a rebase has checked out) keeps that one, with git's reason, and gc goes on with the rest.
    """
    # The checks `overnight run` makes: a path that is a file, or no repository, is a ConfigError;
    # so is a base that names no commit (renamed since), against which every commit looks unmerged.
    repo = open_repo(config.repo_path)
    check_base(repo, config.repo.base)
    sweep = Sweep(GcGit(config.repo_path), Path(repo.common_dir), config, force, dry_run)
    _repair_moved(repo, config.worktrees_dir)
    ours, detached, checked_out, locks = worktrees(sweep.git, config.worktrees_dir, sweep.common)
    # `ours` too: a task's worktree whose branch a person deleted (`git update-ref -d`) is still the task's.
    stale = sorted((task_branches(sweep.git) | ours.keys() | detached.keys()) - {task.name for task in config.task})
    removed_worktrees, kept_worktrees, kept_on_branch = sweep.worktrees(stale, ours, detached, locks)
    removed_branches, kept_branches = sweep.branches(stale, {**checked_out, **kept_on_branch})
    return GcResult(tuple(removed_worktrees), tuple(removed_branches), tuple(kept_branches), dry_run, tuple(kept_worktrees))


def _repair_moved(repo, worktrees_dir: Path) -> None:
    """Task worktrees moved into `worktrees_dir` with the state dir are registered here again
    (`git worktree repair`, as `overnight run` does; a dry run too: it deletes nothing)."""
    try:
        folders = sorted(folder for folder in worktrees_dir.iterdir() if folder.is_dir() and not folder.is_symlink())
    except OSError:
        return
    for folder in folders:
        repair_moved(repo, folder)
