"""HEAD kept on a task's branch, at the commit the night expects, whoever moved it.

A person detaches HEAD to check the branch out in their own checkout; the agent's own git may leave a rebase half
done, HEAD on another branch, or the branch moved off the iteration's checkpoint. Left so, the night's checkpoint,
commit or rollback would move the branch off commits it should keep, or record the worktree on the wrong branch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from orchestrator.branch_holders import also_held_elsewhere, head_file, held_elsewhere
from orchestrator.git_errors import CHECKED_OUT_AT, git_reason
from orchestrator.gitdir import head_commit
from orchestrator.operations_under_way import quit_operations
from orchestrator.task_branches import BranchCheckedOut, kept_branch


def log_commits_kept(task: str, branch: str) -> None:
    """`worktree_commits_kept` for a caller with no task run to name (a night names its own: orchestrator/worktrees_ahead.py)."""
    from orchestrator.logs import get_logger

    get_logger().warning("worktree_commits_kept", task=task, branch=branch)


def back_on_branch(
    git: Callable[..., str], path: Path, admin: Path, common: Path, branch: str, task: str,
    on_commits_kept: Callable[[str, str], None] | None = None,
) -> None:
    """Put HEAD back on `branch`, at the branch's tip, files and all, when a person left it off (git makes them
    detach it before they check the branch out in their own checkout).

    Otherwise the night's checkpoint would be where HEAD was left, and its first commit or
    rollback would move the branch off the commits the person added to it since. Commits the
    person made on the detached HEAD itself are first kept on `overnight-kept/<task>/<UTC time>`.
    A file read when HEAD is on the branch, as it is after every night; BranchCheckedOut
    (nothing changed) while another worktree has the branch checked out, or rebases or bisects it.
    """
    import git as gitpython

    if head_file(admin) == f"ref: refs/heads/{branch}":
        # Git lets a person check the branch out beside it (`checkout --ignore-other-worktrees`):
        # the night's commit or rollback would then move their checkout's branch under it.
        taken = also_held_elsewhere(admin, common, branch)
        if taken is not None:
            raise BranchCheckedOut(task, branch, taken)
        return
    taken = held_elsewhere(git, path, admin, common, branch)
    if taken is not None:
        raise BranchCheckedOut(task, branch, taken)
    try:
        if git("branch", "--list", branch).strip():
            _keep_commits_only_head_has(git, branch, task, on_commits_kept or log_commits_kept)
            git("checkout", "--quiet", "--force", branch)
        else:  # the branch was deleted: made again where HEAD is
            git("checkout", "--quiet", "-b", branch)
    except gitpython.GitCommandError as exc:
        taken_at = CHECKED_OUT_AT.search(git_reason(exc))
        if taken_at:  # taken between the look and the checkout
            raise BranchCheckedOut(task, branch, taken_at.group(1)) from None
        raise


def _keep_commits_only_head_has(git: Callable[..., str], branch: str, task: str, kept_on: Callable[[str, str], None]) -> None:
    """A detached HEAD with commits the branch lacks (a person's, made there): a branch of their own first."""
    import git as gitpython

    try:
        git("merge-base", "--is-ancestor", "HEAD", branch)
        return
    except gitpython.GitCommandError as exc:
        if exc.status != 1:
            raise
    kept = kept_branch(task)
    git("branch", kept, "HEAD")
    kept_on(task, kept)


def onto_branch(git: Callable[..., str], admin: Path, branch: str) -> list[str]:
    """Undo what the agent's own git left that would send overnight's reset or commit off `branch`; the operations
    it had left under way, quit (see operations_under_way.py).

    A rebase, merge, cherry-pick, revert or bisect under way is quit, and HEAD (moved to another
    branch, or detached) is pointed back at `branch` with the files and index as they are: a commit
    then records the worktree exactly, on the branch's tip, with one parent. File checks and a
    read; a process only if amiss.
    """
    dropped = quit_operations(git, admin)
    if head_file(admin) != f"ref: refs/heads/{branch}":
        git("symbolic-ref", "HEAD", f"refs/heads/{branch}")
    return dropped


def keep_on_branch(git: Callable[..., str], admin: Path, common: Path, checkpoint: str) -> None:
    """Put the branch back on `checkpoint` if the agent moved it off (a ref read; a process only then)."""
    import git as gitpython

    tip = head_commit(admin, common)
    if tip == checkpoint:
        return
    if tip is not None:
        try:
            git("merge-base", "--is-ancestor", checkpoint, tip)
            return  # the agent's own commits, on top of the checkpoint
        except gitpython.GitCommandError as exc:
            if exc.status != 1:  # 1: not an ancestor
                raise
    git("reset", "--soft", "--quiet", checkpoint)
