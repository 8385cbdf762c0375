"""git as `overnight gc` runs it in the user's repository, and what gc reads there: worktrees, task branches, refs."""

from __future__ import annotations

import subprocess
from pathlib import Path

from orchestrator.command_environment import UNATTENDED_ENV, base_environment
from orchestrator.errors import ConfigError
from orchestrator.gitdir import admin_dir
from orchestrator.overnights_own import is_task_worktree
from orchestrator.task_branches import BRANCH_PREFIX

_GIT_ENV = {**UNATTENDED_ENV, "LC_ALL": "C"}  # C: git's messages are parsed


class GcGitFailed(ConfigError):
    """A git command gc ran failed; `detail` is git's one line, without its "fatal:" or "error:"."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail.removeprefix("fatal:").removeprefix("error:").strip()


class GcGit:
    """git in one folder of the user's repository; never prompts, never pages."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _call(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], stdin=subprocess.DEVNULL, text=True, **self._options())

    def _options(self) -> dict:
        """subprocess.run's arguments for any git command here."""
        return dict(
            cwd=self.folder,
            # Without an inherited GIT_DIR (a hook, a shell's dotfiles): it would send gc to another repository.
            env={**base_environment(), **_GIT_ENV},
            capture_output=True,
            timeout=120,
        )

    def run(self, *args: str) -> str:
        done = self._call(*args)
        if done.returncode != 0:
            raise self._failed(args, done.stderr)
        return done.stdout

    def feed(self, *args: str, data: bytes) -> bytes:
        """git's output, bytes as they are, for `data` on its standard input (a patch, which need not be text)."""
        done = subprocess.run(["git", *args], input=data, **self._options())
        if done.returncode != 0:
            raise self._failed(args, done.stderr.decode(errors="replace"))
        return done.stdout

    def _failed(self, args: tuple[str, ...], stderr: str) -> GcGitFailed:
        lines = stderr.strip().splitlines() or ["failed"]
        # git's own "fatal:" or "error:" line says why; hints follow it (for dubious ownership, a command to copy).
        detail = next((line.strip() for line in lines if line.startswith(("fatal:", "error:"))), lines[-1].strip())
        if not detail.removeprefix("fatal:").removeprefix("error:").strip():
            detail = "git failed and said no more"  # an empty reason would count the worktree or branch as removed
        return GcGitFailed(f"gc: git {' '.join(args[:2])} failed in {self.folder}: {detail}", detail)

    def resolve(self, revision: str) -> str | None:
        done = self._call("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
        return done.stdout.strip() or None if done.returncode == 0 else None

    def symbolic_ref(self, base: str) -> str:
        """The full ref `[repo] base` names (HEAD on a branch: that branch's), or "" when it names none."""
        done = self._call("rev-parse", "--symbolic-full-name", base)
        return done.stdout.strip() if done.returncode == 0 else ""


def task_branches(git: GcGit) -> set[str]:
    refs = git.run("for-each-ref", "--format=%(refname)", f"refs/heads/{BRANCH_PREFIX}").split()
    names = {ref.removeprefix(f"refs/heads/{BRANCH_PREFIX}") for ref in refs}
    # Task names hold no slash, so overnight/a/b was made by someone else.
    return {name for name in names if "/" not in name}


def worktrees(git: GcGit, worktrees_dir: Path, common: Path) -> tuple[dict[str, Path], dict[str, tuple[Path, str]], dict[str, str], dict[Path, str]]:
    """Task worktrees by task name (on their branch, and on a detached HEAD), where every other
    worktree has its branch checked out (by branch), and the locked worktrees with the lock's
    reason ("" when none was given).

    Only `<worktrees_dir>/<task>` is a task's: on `overnight/<task>`, or detached (with its HEAD
    commit; git makes a person detach it to check the task's branch out in their own checkout for
    review), when a night marked it as the task's (overnights_own.py). The main worktree and any
    the user added are theirs, whatever their branch (a detached one in `<worktrees_dir>` too), and
    their branches stay.
    """
    ours: dict[str, Path] = {}
    detached: dict[str, tuple[Path, str]] = {}
    theirs: dict[str, str] = {}
    locks: dict[Path, str] = {}
    home = worktrees_dir.resolve()
    for index, block in enumerate(_worktree_blocks(git)):
        if "worktree" not in block:
            continue
        path = Path(block["worktree"])
        branch = block.get("branch", "").removeprefix("refs/heads/")
        if "locked" in block:
            locks[path] = block["locked"]
        in_home = index > 0 and path.resolve().parent == home
        if in_home and branch == BRANCH_PREFIX + path.name:
            ours[path.name] = path
        elif in_home and "detached" in block and "/" not in path.name and _marked_as_the_tasks(path, common):
            detached[path.name] = (path, block.get("HEAD", "HEAD"))
        elif branch and "prunable" in block:
            theirs[branch] = f"{path}, a folder that no longer exists (`git worktree prune` forgets it)"
        elif branch:
            theirs[branch] = str(path)
    return ours, detached, theirs, locks


def _marked_as_the_tasks(path: Path, common: Path) -> bool:
    """Whether the detached worktree at `path` is its task's: a person's own, detached there, is not (overnights_own.py)."""
    admin = admin_dir(path, common)
    return admin is not None and is_task_worktree(admin, path.name)


def _worktree_blocks(git: GcGit) -> list[dict[str, str]]:
    """`git worktree list --porcelain`, one dict a worktree; the main worktree first."""
    blocks: list[dict[str, str]] = []
    for chunk in git.run("worktree", "list", "--porcelain").split("\n\n"):
        fields = dict((line.split(" ", 1) + [""])[:2] for line in chunk.splitlines() if line)
        if fields:
            blocks.append(fields)
    return blocks
