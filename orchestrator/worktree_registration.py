"""A task's worktree registered in the user's repository: made the first time, forgotten when its folder
is gone, repaired when it moved with the state dir; and what a failed creation is the fault of.

`git worktree add --no-checkout` only: the checkout of the files (the slow part in a large repository)
is first_checkout.py's, outside the lock that serialises registration.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from pathlib import Path

from orchestrator.errors import ConfigError, StateError
from orchestrator.foreign_checkout import refuse_a_foreign_repository
from orchestrator.git_errors import CHECKED_OUT_AT, git_reason
from orchestrator.gitdir import admin_dir, is_worktree_of, linked_admin_dir, names_back
from orchestrator.ref_storage import BranchesUnknown, branch_names
from orchestrator.state_dir_exclude import exclude_state_dir
from orchestrator.state_files import WORKTREES_FOLDER
from orchestrator.task_branches import BranchCheckedOut

# `git worktree add` run concurrently in one repository corrupts its neighbours
# (seen: "failed to read .git/worktrees/<name>/commondir"); one at a time per process.
_REGISTER_LOCK = threading.Lock()

# What git says when the state dir's disk, not the configuration, is at fault. (A checkout that
# cannot write a file says only "unable to write file X", without the system's reason.)
_STORAGE_FAULTS = re.compile(
    r"No space left on device|Disk quota exceeded|Read-only file system|Permission denied|Operation not permitted|"
    r"Input/output error|unable to (write|create) file|could not write",
    re.IGNORECASE,
)
# Less free space than this on the worktree's disk after a failed checkout: the disk is full.
_NEARLY_FULL_BYTES = 1 << 20


def ensure_registered(repo, state_dir: Path, path: Path, task: str, branch: str, base: str) -> Path | None:
    """Register the worktree folder `path` of `task` in `repo`, on `branch` (made from `base` if new), unless it is.
    Its admin folder when it was registered already; None when it was registered, or repaired, just now.

    Safe to call from several threads: only the registration itself is serialised. WorktreeFolderTaken (nothing
    changed) when a repository of a person's, or another repository's worktree, is in the folder.
    """
    common = Path(repo.common_dir)
    refuse_a_foreign_repository(path, common, task)
    # Found registered on every night after a task's first, from two small files: no lock needed.
    # (Also when the agent broke the link: the registration names the folder, and the link is repaired.)
    admin = admin_dir(path, common)
    if admin is None:
        with _REGISTER_LOCK:
            # A folder moved here with the state dir is registered where it was: repaired, not made anew.
            if admin_dir(path, common) is None and not repair_moved(repo, path):
                _register(repo, state_dir, path, task, branch, base)
    return admin


def _register(repo, state_dir: Path, path: Path, task: str, branch: str, base: str) -> None:
    """`git worktree add --no-checkout` for `task` on `branch` (made from `base` if new); under _REGISTER_LOCK."""
    import git

    exclude_state_dir(repo, state_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StateError(f"cannot create the worktree of task {task!r} at {path}: {exc.strerror or exc}") from None
    what = f"cannot create the worktree of task {task!r} at {path}"

    def branches() -> set[str]:
        try:
            return branch_names(repo)
        except BranchesUnknown as unknown:  # not "no branch": `-b` over the task's work, or its branch deleted below
            raise creation_error(what, unknown.reason, path.parent) from None

    made_branch = branch not in branches()

    def add() -> None:
        # `-b` only while the branch is not there: a failed first try may have made it already.
        new_branch = () if branch in branches() else ("-b", branch)
        repo.git.worktree("add", "--no-checkout", *new_branch, str(path), branch if not new_branch else base)

    try:
        add()
    except git.GitCommandError as first:
        try:
            # A worktree folder deleted by hand is still registered: forgotten, then once more.
            forget_missing(Path(repo.common_dir), path)
            add()
        except git.GitCommandError as second:
            if made_branch and _listed(repo, branch):
                repo.git.branch("-D", branch)  # made by this call, for a worktree that is not there
            taken = CHECKED_OUT_AT.search(git_reason(first)) or CHECKED_OUT_AT.search(git_reason(second))
            if taken:
                raise BranchCheckedOut(task, branch, taken.group(1)) from None
            failed = creation_error(what, git_reason(first), path.parent)
            raise with_git_status(failed, first) from None


def _listed(repo, branch: str) -> bool:
    """Whether git lists `branch`; not when it cannot list the branches (one it cannot tell about is not deleted)."""
    try:
        return branch in branch_names(repo)
    except BranchesUnknown:
        return False


def forget_missing(common: Path, path: Path) -> None:
    """What `git worktree prune` does, for the registration of `path` alone, when its folder is gone.

    Not prune itself: it forgets every worktree whose folder is missing, the user's own on a disk
    not mounted tonight too (its HEAD, index and reflog; a commit only it held is then lost to
    the next `git gc`). A locked registration stays, as prune leaves it.
    """
    if os.path.lexists(path / ".git"):
        return
    try:
        registered = sorted((common / "worktrees").iterdir())
    except OSError:
        return
    for admin in registered:
        if names_back(admin, path) and not (admin / "locked").exists():
            shutil.rmtree(admin, ignore_errors=True)


def with_git_status(error: ConfigError | StateError, git_error: BaseException) -> ConfigError | StateError:
    """`error`, carrying the exit status of the git it stands for (`git_status`: negative when a signal killed
    it): a git that died of the signal stopping the night (systemd's control-group kill reaches it in its own
    process group) is the night's stop, not a setup git refuses (task_work._worktree tells them apart)."""
    error.git_status = getattr(git_error, "status", None)  # type: ignore[attr-defined]
    return error


def creation_error(what: str, reason: str, folder: Path) -> ConfigError | StateError:
    """A full or read-only disk is the state dir's fault (exit 4, as anywhere else in a night); anything
    else git refuses in making a worktree (a base it cannot check out, a filter it lacks) is the setup's (exit 2)."""
    if _STORAGE_FAULTS.search(reason):
        return StateError(f"{what}: {reason}")
    try:
        disk = os.statvfs(folder)
    except OSError:
        return ConfigError(f"{what}: {reason}")
    if disk.f_flag & os.ST_RDONLY:
        return StateError(f"{what}: {reason} (its disk is read-only)")
    if disk.f_bavail * disk.f_frsize < _NEARLY_FULL_BYTES:
        return StateError(f"{what}: {reason} (its disk is full)")
    return ConfigError(f"{what}: {reason}")


def moved_from(repo, path: Path) -> Path | None:
    """Where the worktree folder `path` was registered, when it was moved here with the state dir
    (`[state] dir` edited): its `.git` links to a registration in `repo` that names a folder no
    longer there, of the same name, in a folder named `worktrees` as `path` is. None for any
    other folder: a copy whose original still exists leaves the registration to the original, and
    a folder renamed aside (`mv worktrees/fix worktrees/fix.bak`) is a person's, not the task's."""
    admin = linked_admin_dir(repo, path)
    if admin is None or names_back(admin, path) or path.parent.name != WORKTREES_FOLDER:
        return None
    try:
        registered = admin / os.fsdecode((admin / "gitdir").read_bytes()).strip()  # relative: to `admin`
    except OSError:
        return None
    folder = registered.parent
    if registered.name != ".git" or folder.name != path.name or folder.parent.name != WORKTREES_FOLDER:
        return None
    return folder if not folder.exists() else None


def repair_moved(repo, path: Path) -> bool:
    """`git worktree repair` for a folder `moved_from` somewhere: its registration then names `path`. Whether it did."""
    import git

    if moved_from(repo, path) is None:
        return False
    try:
        repo.git.worktree("repair", str(path))
    except git.GitCommandError:
        return False
    return is_worktree_of(repo, path)
