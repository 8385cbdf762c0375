"""Which ref backend a repository keeps its refs in, and HEAD and branches asked of git where it is not files.

The by-hand readers (gitdir.py, branch_holders.py) read `HEAD` and `refs/heads/<branch>` files: git's
"files" backend. A repository made with `git init --ref-format=reftable` (git >= 2.45; git 3.0's
default) keeps its refs in `reftable/` binary tables instead, and its HEAD file (each worktree's too)
holds `ref: refs/heads/.invalid` only to keep older gits off it. There HEAD and branches are asked of
git: a process a question, the price of a layout not read here.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from orchestrator.command_environment import worktree_git_environment
from orchestrator.files import read_regular_file
from orchestrator.git_errors import stderr_reason

# `[extensions]` then `refStorage = <format>` (git config keys and section names are case-insensitive).
_SECTION = re.compile(r"^\s*\[\s*([A-Za-z0-9.-]+)\s*(?:\"[^\"]*\"\s*)?\]\s*(.*)$")
_REF_STORAGE = re.compile(r"^\s*refstorage\s*=\s*\"?([A-Za-z0-9_-]*)\"?\s*(?:[#;].*)?$", re.IGNORECASE)

# What a reftable repository's HEAD files hold (git's placeholder: `.invalid` is no branch name git allows).
REFTABLE_HEAD = "ref: refs/heads/.invalid"

# More than any config git writes holds before its `[extensions]` (the `reftable/` folder tells first anyway).
_CONFIG_MOST_READ = 1 << 20


def ref_storage_named(config_text: str) -> str:
    """The ref backend a repository's `config` names (`extensions.refStorage`): "reftable", or "files" where it
    names none (git's default) or another."""
    section = ""
    for line in config_text.splitlines():
        header = _SECTION.match(line)
        if header:
            section, line = header.group(1).lower(), header.group(2)
        if section == "extensions":
            value = _REF_STORAGE.match(line)
            if value and value.group(1).lower() == "reftable":
                return "reftable"
    return "files"


def is_reftable(common: Path) -> bool:
    """Whether the repository whose git dir is `common` keeps its refs in reftable: its `reftable/` folder (a linked
    worktree's own git dir has one too), else its config's `extensions.refStorage`. Read each time, not kept:
    `git refs migrate` may change it between two nights of one `overnight serve`."""
    if (common / "reftable").is_dir():
        return True
    try:
        # Only a regular file, and only so much of it: a pipe put there held the night for ever.
        config = read_regular_file(common / "config", _CONFIG_MOST_READ)
    except OSError:
        return False
    return ref_storage_named(config.decode("utf-8", "replace")) == "reftable"


class BranchesUnknown(Exception):
    """git could not list the repository's branches: not "there are none", which a caller would act on (make a branch
    that is there, delete one it believes it made)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _run_git(git_dir: Path, *args: str) -> tuple[str | None, str]:
    """git's output for `args` in the git dir `git_dir` (a linked worktree's own is one too), None when it fails, and
    why (its `fatal:` line on stderr, or the error that kept it from running). With the environment of overnight's
    other git (no inherited GIT_DIR or `-c` settings, no hooks, no fsmonitor, nothing waiting for a person): the
    repository, and the worktree's admin folder, may be hostile."""
    env = worktree_git_environment()
    try:
        done = subprocess.run(
            ["git", f"--git-dir={git_dir}", *args], cwd=git_dir, env=env, stdin=subprocess.DEVNULL, capture_output=True,
            timeout=60, check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return None, str(exc)
    if done.returncode != 0:
        died = f"died of signal {-done.returncode}" if done.returncode < 0 else f"exited {done.returncode}"
        # git's own `fatal:` or `error:` line (a warning may come before it, advice after), else its last.
        return None, stderr_reason(done.stderr.decode("utf-8", "replace")) or f"git {args[0]} {died}"
    return done.stdout.decode("utf-8", "replace").strip(), ""


def _git(git_dir: Path, *args: str) -> str | None:
    """git's output for `args` in `git_dir` (`_run_git`); None when it fails."""
    return _run_git(git_dir, *args)[0]


def head_asked(git_dir: Path) -> str:
    """What a files-backend HEAD file would hold, asked of git: "ref: refs/heads/<branch>", the commit when
    detached, "" when git cannot say."""
    branch = _git(git_dir, "symbolic-ref", "-q", "HEAD")
    if branch:
        return f"ref: {branch}"
    return _git(git_dir, "rev-parse", "-q", "--verify", "HEAD") or ""


def commit_asked(git_dir: Path, revision: str = "HEAD") -> str | None:
    """`revision`'s commit asked of git; None when it names none (a branch with no commit yet, no such branch)."""
    return _git(git_dir, "rev-parse", "-q", "--verify", f"{revision}^{{commit}}") or None


def branch_tip(repo, branch: str) -> str | None:
    """The commit `branch` of a git.Repo is on, None when there is no such branch. GitPython's `repo.heads` reads
    ref files: asked of git in a reftable repository."""
    common = Path(repo.common_dir)
    if is_reftable(common):
        return commit_asked(common, f"refs/heads/{branch}")
    return repo.heads[branch].commit.hexsha if branch in repo.heads else None


def has_branch(repo, branch: str) -> bool:
    """Whether a git.Repo has the local branch `branch`, asked by its name (a listing of every branch may fail where
    this answers); one git cannot read is none."""
    common = Path(repo.common_dir)
    if is_reftable(common):
        return commit_asked(common, f"refs/heads/{branch}") is not None
    return branch in repo.heads


def branch_names(repo) -> set[str]:
    """A git.Repo's local branches (GitPython's reader where the refs are files, git where they are reftable).
    BranchesUnknown when git fails to list them: read as none, a task's branch was made anew over its work."""
    common = Path(repo.common_dir)
    if is_reftable(common):
        listed, why = _run_git(common, "for-each-ref", "--format=%(refname:lstrip=2)", "refs/heads/")
        if listed is None:
            raise BranchesUnknown(f"git could not list the branches: {why}")
        # Split at newlines only: a branch name may hold U+2028 or U+0085, which splitlines() also breaks at.
        return set(filter(None, listed.split("\n")))
    return {head.name for head in repo.heads}


def checked_out_branch(repo) -> str | None:
    """The branch a git.Repo's checkout has checked out; None when detached (GitPython's reader for files)."""
    if is_reftable(Path(repo.common_dir)):
        head = head_asked(Path(repo.git_dir))
        return head.removeprefix("ref: refs/heads/") if head.startswith("ref: refs/heads/") else None
    try:
        return repo.active_branch.name
    except TypeError:  # detached
        return None
