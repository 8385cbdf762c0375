"""What differs from a worktree's HEAD, saved as a commit on a branch of its own, worktree and index untouched.

Recovery and gc keep so what a person (or a dead iteration) left in a task's worktree before they roll it back or
remove it (`overnight-kept/...`). Built in an index of its own: the worktree's index, and what the agent staged
there, stay as they were.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from orchestrator.add_paths import folders_of
from orchestrator.overnights_own import first_checkout_cut_short
from orchestrator.records import KeptOutOfCommit
from orchestrator.work_paths import untracked

if TYPE_CHECKING:
    from orchestrator.passed_secrets import PassedSecrets
    from orchestrator.secret_commits import SecretKeeping

# glibc's malloc gave the heap back to the kernel and took it again for each object update-index wrote
# (four brk calls a file: 0.4 s of system time for 5,000 new files, against 0.15 s so); ignored elsewhere.
_KEEP_HEAP = {"MALLOC_TRIM_THRESHOLD_": str(4 << 20)}


def changes_branch(
    git: Callable[..., str], admin: Path, keep: Sequence[str], branch: str, message: str, secrets: PassedSecrets | None,
    secret_keeping: Callable[[PassedSecrets], SecretKeeping], on_kept_out: Callable[[KeptOutOfCommit], None] | None,
    onto: str | None,
) -> str | None:
    """The commit on the new `branch` holding what differs from HEAD (see `Worktree.keep_changes`); None if nothing does."""
    if first_checkout_cut_short(admin):
        # A first checkout cut short: what differs is what it had not written yet. Checked out whole once, the index
        # was lost since (a person or an agent deleted it): what differs from HEAD is someone's, kept as any change.
        return None
    parent = _kept_parent(git, onto, secrets, secret_keeping)
    with tempfile.TemporaryDirectory(prefix="overnight-keep-") as folder:
        index = {"GIT_INDEX_FILE": os.path.join(folder, "index"), "GIT_LITERAL_PATHSPECS": "1"}
        git("read-tree", "HEAD", env=index)
        git("add", "--update", env=index)  # tracked files changed or deleted
        # A nested repository shows as its folder ("scratch/"): git would add a link to its
        # commit, or fail when it has none, never its files. Left out, as the cleaning always did.
        new_files = [name for name in untracked(git, keep, env=index) if not name.endswith("/")]
        if new_files:
            _add_new_files(git, new_files, env=index)
        if secrets:
            kept_out = secret_keeping(secrets).keep_out(index, parent)
            if kept_out is not None and on_kept_out is not None:
                on_kept_out(kept_out)
        tree = git("write-tree", env=index).strip()
    if tree == git("rev-parse", f"{parent}^{{tree}}").strip():
        return None
    commit = git("commit-tree", tree, "-p", parent, "-m", message, identity=True).strip()
    git("branch", branch, commit)
    return commit


def _kept_parent(
    git: Callable[..., str], onto: str | None, secrets: PassedSecrets | None, secret_keeping: Callable[[PassedSecrets], SecretKeeping]
) -> str:
    """The kept branch's parent: HEAD, or `onto` below the agent's own commits when their history would carry a
    value. A checkpoint this clone lacks (the rollback's case too) leaves HEAD: nothing above it can be told apart."""
    import git as gitpython

    if not secrets or onto is None:
        return "HEAD"
    try:
        git("rev-parse", "--verify", "--quiet", f"{onto}^{{commit}}")
    except gitpython.GitCommandError:
        return "HEAD"
    return onto if secret_keeping(secrets).commits_hold_values(onto) else "HEAD"


def _add_new_files(git: Callable[..., str], names: list[str], env: dict[str, str]) -> None:
    """The untracked files `names` into the index `env` names."""
    listed = b"\0".join(os.fsencode(name) for name in names)
    if _in_folders_of_another_case(git, names, env):
        # A case-insensitive disk (macOS, Windows): `git add` files "dir/new" under the index's "Dir/",
        # update-index beside it, a second folder a checkout there cannot tell from the first.
        git("add", "--pathspec-from-file=-", "--pathspec-file-nul", env=env, stdin=listed)
        return
    # Paths, not pathspecs: `git add` matched each file against every pathspec given, seconds for
    # a person's thousands of new files; update-index takes each name as it is (filters and line
    # endings applied as `add` applies them), --replace as `add` replaces a file that became a
    # folder, --remove passes over one deleted since it was listed (an editor's swap file), which
    # `add` and update-index alone refuse, stopping the night.
    git("update-index", "--add", "--remove", "--replace", "-z", "--stdin", env={**env, **_KEEP_HEAP}, stdin=listed)


def _in_folders_of_another_case(git: Callable[..., str], names: list[str], env: dict[str, str]) -> bool:
    """Whether git takes names case-insensitively (core.ignorecase) and one of `names` lies in a folder the
    index `env` names holds in another case ("lib/new.py" beside "Lib/old.py")."""
    if git("config", "--type=bool", "--default=false", "--get", "core.ignorecase").strip() != "true":
        return False
    tracked = {os.path.dirname(name) for name in git("ls-files", "-z", env=env).split("\0") if name}
    tracked_folders = {folder for name in tracked for folder in folders_of(name)}
    in_any_case = {folder.lower() for folder in tracked_folders}
    return any(
        folder not in tracked_folders and folder.lower() in in_any_case
        for name in names for folder in folders_of(os.path.dirname(name))
    )
