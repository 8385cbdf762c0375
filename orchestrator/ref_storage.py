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
from dataclasses import dataclass
from pathlib import Path

from orchestrator.command_environment import worktree_git_environment
from orchestrator.errors import ConfigError
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


class RefsUnreadable(ConfigError):
    """git could not read the repository's refs (its `fatal:` line, a crash, a timeout): not "no such ref", which a
    caller would act on (roll a task's branch back, make it anew over its work). One line, exit 2, as any setup git
    refuses; the night touches nothing of the repository's first."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BranchesUnknown(RefsUnreadable):
    """git could not list the repository's branches: not "there are none", which a caller would act on (make a branch
    that is there, delete one it believes it made)."""


# git's exit status for an answer of "none": `rev-parse -q --verify` naming nothing, `symbolic-ref -q` on a detached
# HEAD. A git that cannot read the refs dies (128), or is killed.
_NONE_THERE = 1


@dataclass(frozen=True)
class _GitAnswer:
    """What one git run said."""

    output: str | None  # its stdout, stripped; None when it failed
    why: str  # why it failed: git's `fatal:` line, how it died, or what kept it from running
    status: int | None  # its exit status (negative: the signal that killed it); None when it never ran or timed out


def _run_git(git_dir: Path, *args: str) -> _GitAnswer:
    """git's answer to `args` in the git dir `git_dir` (a linked worktree's own is one too). With the environment of
    overnight's other git (no inherited GIT_DIR or `-c` settings, no hooks, no fsmonitor, nothing waiting for a
    person): the repository, and the worktree's admin folder, may be hostile."""
    env = worktree_git_environment()
    try:
        done = subprocess.run(
            ["git", f"--git-dir={git_dir}", *args], cwd=git_dir, env=env, stdin=subprocess.DEVNULL, capture_output=True,
            timeout=60, check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return _GitAnswer(None, str(exc), None)
    if done.returncode != 0:
        died = f"died of signal {-done.returncode}" if done.returncode < 0 else f"exited {done.returncode}"
        # git's own `fatal:` or `error:` line (a warning may come before it, advice after), else its last.
        why = stderr_reason(done.stderr.decode("utf-8", "replace")) or f"git {args[0]} {died}"
        return _GitAnswer(None, why, done.returncode)
    return _GitAnswer(done.stdout.decode("utf-8", "replace").strip(), "", 0)


def _asked(git_dir: Path, what: str, *args: str) -> str | None:
    """git's answer to `args`; None when it answers "none" (exit 1). RefsUnreadable, naming `what` was asked and git's
    reason, when it could not read the refs: that read as "none" rolled a branch back, or made it anew, over work."""
    answer = _run_git(git_dir, *args)
    if answer.output is not None:
        return answer.output
    if answer.status == _NONE_THERE:
        return None
    raise RefsUnreadable(f"git could not read {what} in {git_dir}: {answer.why}")


def head_asked(git_dir: Path) -> str:
    """What a files-backend HEAD file would hold, asked of git: "ref: refs/heads/<branch>", or the commit when
    detached. RefsUnreadable when git cannot read HEAD: HEAD is always in a reftable stack git can read, and git
    (2.47) reads a stack it cannot load (a table it lists gone, `tables.list` garbled) as one holding no ref."""
    branch = _asked(git_dir, "HEAD", "symbolic-ref", "-q", "HEAD")
    if branch:
        return f"ref: {branch}"
    commit = _asked(git_dir, "HEAD", "rev-parse", "-q", "--verify", "HEAD")
    if commit:
        return commit
    raise RefsUnreadable(f"git could not read HEAD in {git_dir}: it names neither a branch nor a commit (its reftable lost or damaged)")


def commit_asked(git_dir: Path, revision: str = "HEAD", common: Path | None = None) -> str | None:
    """`revision`'s commit asked of git; None when it names none (a branch with no commit yet, no such branch).
    RefsUnreadable when git could not read the refs, also where it answered "none" (head_asked tells). `common`: the
    repository's git dir when `git_dir` is a linked worktree's, whose own stack holds its HEAD but not the branches."""
    commit = _asked(git_dir, revision, "rev-parse", "-q", "--verify", f"{revision}^{{commit}}")
    if commit:
        return commit
    # A stack git could not load answers "none" too: HEAD is there in one it can read. A worktree's HEAD, read from its
    # own stack, says nothing of the repository's (its `reftable/` gone, `tables.list` emptied), where its branch is.
    for stack in (git_dir,) if common is None or common == git_dir else (git_dir, common):
        head_asked(stack)
    return None


def branch_tip(repo, branch: str) -> str | None:
    """The commit `branch` of a git.Repo is on, None when there is no such branch. GitPython's `repo.heads` reads
    ref files: asked of git in a reftable repository, RefsUnreadable when git cannot read them."""
    common = Path(repo.common_dir)
    if is_reftable(common):
        return commit_asked(common, f"refs/heads/{branch}")
    return repo.heads[branch].commit.hexsha if branch in repo.heads else None


def has_branch(repo, branch: str) -> bool:
    """Whether a git.Repo has the local branch `branch`, asked by its name (a listing of every branch may fail where
    this answers); one git cannot read is none: only the morning diff asks, to pick a name to show (nothing acts on it)."""
    common = Path(repo.common_dir)
    if is_reftable(common):
        try:
            return commit_asked(common, f"refs/heads/{branch}") is not None
        except RefsUnreadable:
            return False
    return branch in repo.heads


def branch_names(repo) -> set[str]:
    """A git.Repo's local branches (GitPython's reader where the refs are files, git where they are reftable).
    BranchesUnknown when git fails to list them, or lists none from refs it cannot read: read as none, a task's branch
    was made anew over its work."""
    common = Path(repo.common_dir)
    if is_reftable(common):
        listed = _run_git(common, "for-each-ref", "--format=%(refname:lstrip=2)", "refs/heads/")
        if listed.output is None:
            raise BranchesUnknown(f"git could not list the branches: {listed.why}")
        # Split at newlines only: a branch name may hold U+2028 or U+0085, which splitlines() also breaks at.
        names = set(filter(None, listed.output.split("\n")))
        if not names:  # a stack git could not load lists nothing too (git 2.47): HEAD, there in one it can read, tells
            try:
                head_asked(common)
            except RefsUnreadable as unreadable:
                raise BranchesUnknown(f"git could not list the branches: {unreadable.reason}") from None
        return names
    return {head.name for head in repo.heads}


def checked_out_branch(repo) -> str | None:
    """The branch a git.Repo's checkout has checked out; None when detached (GitPython's reader for files).
    RefsUnreadable where git cannot read a reftable HEAD."""
    if is_reftable(Path(repo.common_dir)):
        head = head_asked(Path(repo.git_dir))
        return head.removeprefix("ref: refs/heads/") if head.startswith("ref: refs/heads/") else None
    try:
        return repo.active_branch.name
    except TypeError:  # detached
        return None
