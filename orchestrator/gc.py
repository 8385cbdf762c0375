"""`overnight gc`: remove the worktrees and branches of tasks that left the config.

Only `overnight/<name>` branches and the worktrees that hold them are ever
touched; the user's checkout (the main worktree) and every other branch are
not. A stale task's worktree is always removed: an iteration either commits
or is rolled back, so the worktree holds nothing the branch does not, and
`Worktree.ensure` recreates it from the branch if the task comes back. The
branch is deleted only when its tip is merged into `[repo] base` or contained
in a remote-tracking branch (pushed); otherwise it is kept, with the reason,
unless `force`. Transcripts, notes.md and the run store keep their history.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config import Config
from orchestrator.errors import ConfigError
from orchestrator.worktree import BRANCH_PREFIX

_QUIET = {"GIT_TERMINAL_PROMPT": "0", "GIT_PAGER": "cat", "GIT_EDITOR": "true", "LC_ALL": "C"}


@dataclass(frozen=True)
class KeptBranch:
    branch: str
    reason: str


@dataclass(frozen=True)
class GcResult:
    """What gc removed (or, with dry_run, would remove) and what it kept and why."""

    removed_worktrees: tuple[Path, ...] = ()
    removed_branches: tuple[str, ...] = ()
    kept_branches: tuple[KeptBranch, ...] = ()
    dry_run: bool = False

    def lines(self) -> list[str]:
        verb = "would remove" if self.dry_run else "removed"
        lines = [f"{verb} worktree {path}" for path in self.removed_worktrees]
        lines += [f"{verb} branch {branch}" for branch in self.removed_branches]
        lines += [f"kept branch {kept.branch}: {kept.reason}" for kept in self.kept_branches]
        return lines or ["nothing to collect"]


def collect_garbage(config: Config, *, force: bool = False, dry_run: bool = False) -> GcResult:
    """Remove worktrees and `overnight/` branches of tasks no longer in `config`."""
    git = _Git(config.repo_path)
    current = {task.name for task in config.task}
    worktrees = _task_worktrees(git)
    stale = sorted({*_task_branches(git), *worktrees} - current)
    removed_worktrees: list[Path] = []
    for name in stale:
        if name in worktrees:
            # A folder deleted by hand is only a registration; prune below forgets it.
            if not dry_run and worktrees[name].exists():
                git.run("worktree", "remove", "--force", str(worktrees[name]))
            removed_worktrees.append(worktrees[name])
    if not dry_run:
        git.run("worktree", "prune")
    removed_branches: list[str] = []
    kept: list[KeptBranch] = []
    base = git.resolve(config.repo.base)
    user_branches = _branches_checked_out_by_user(git)
    for name in stale:
        branch = BRANCH_PREFIX + name
        tip = git.resolve(f"refs/heads/{branch}")
        if tip is None:
            continue
        if branch in user_branches:
            kept.append(KeptBranch(branch, "checked out in your own checkout"))
            continue
        unsafe = None if force else _why_unsafe(git, tip, base, config.repo.base)
        if unsafe:
            kept.append(KeptBranch(branch, unsafe))
            continue
        if not dry_run:
            git.run("branch", "-D", "--quiet", branch)
        removed_branches.append(branch)
    return GcResult(tuple(removed_worktrees), tuple(removed_branches), tuple(kept), dry_run)


def _why_unsafe(git: _Git, tip: str, base: str | None, base_name: str) -> str | None:
    """None when deleting the branch loses no commit; else why it would."""
    if base is not None and git.ok("merge-base", "--is-ancestor", tip, base):
        return None
    if git.run("branch", "-r", "--contains", tip).strip():
        return None
    unmerged = git.run("rev-list", "--count", tip, *([f"^{base}"] if base else [])).strip()
    return f"{unmerged} commit(s) not merged into {base_name} and not pushed (use --force to delete)"


def _task_branches(git: _Git) -> set[str]:
    refs = git.run("for-each-ref", "--format=%(refname)", f"refs/heads/{BRANCH_PREFIX}").split()
    names = {ref.removeprefix(f"refs/heads/{BRANCH_PREFIX}") for ref in refs}
    # Task names hold no slash, so overnight/a/b was made by someone else.
    return {name for name in names if "/" not in name}


def _task_worktrees(git: _Git) -> dict[str, Path]:
    """Linked worktrees on an overnight/<task> branch; the main worktree is never one."""
    found: dict[str, Path] = {}
    for block in _worktree_blocks(git)[1:]:
        ref = block.get("branch", "")
        name = ref.removeprefix(f"refs/heads/{BRANCH_PREFIX}")
        if ref.startswith(f"refs/heads/{BRANCH_PREFIX}") and "/" not in name and "worktree" in block:
            found[name] = Path(block["worktree"])
    return found


def _branches_checked_out_by_user(git: _Git) -> set[str]:
    """The branch of the main worktree: the user's checkout, never ours to change."""
    blocks = _worktree_blocks(git)
    ref = blocks[0].get("branch", "") if blocks else ""
    return {ref.removeprefix("refs/heads/")} if ref else set()


def _worktree_blocks(git: _Git) -> list[dict[str, str]]:
    blocks: list[dict[str, str]] = []
    for chunk in git.run("worktree", "list", "--porcelain").split("\n\n"):
        fields = dict((line.split(" ", 1) + [""])[:2] for line in chunk.splitlines() if line)
        if fields:
            blocks.append(fields)
    return blocks


class _Git:
    """git in the user's repository; never prompts, never pages."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        if not self.ok("rev-parse", "--git-dir"):
            raise ConfigError(f"[repo] path: {repo} is not a git repository")

    def _call(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", *args],
            cwd=self.repo,
            env={**os.environ, **_QUIET},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def run(self, *args: str) -> str:
        done = self._call(*args)
        if done.returncode != 0:
            detail = (done.stderr.strip().splitlines() or ["failed"])[-1]
            raise ConfigError(f"gc: git {' '.join(args[:2])} failed in {self.repo}: {detail}")
        return done.stdout

    def ok(self, *args: str) -> bool:
        return self._call(*args).returncode == 0

    def resolve(self, revision: str) -> str | None:
        done = self._call("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
        return done.stdout.strip() or None if done.returncode == 0 else None
