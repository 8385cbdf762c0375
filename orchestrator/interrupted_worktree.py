"""The worktree of an iteration that died while it ran, rolled back to its checkpoint, or to the commit
it had made but not recorded.

Apart because a dead iteration's worktree may hold more than its own work: what a person did there since
the night died (commits on the branch, edited files) is told from the agent's by time, and kept.
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from pathlib import Path
from typing import Any

from orchestrator.config import Config
from orchestrator.foreign_checkout import is_a_repository_of_its_own, made_while_the_agent_ran
from orchestrator.git_locks import remove_git_locks
from orchestrator.gitdir import admin_dir_for_recovery, common_of
from orchestrator.kept_edits import keep_what_a_person_may_have_written
from orchestrator.ref_storage import branch_tip
from orchestrator.task_branches import branch_for
from orchestrator.vanished_repository import of_a_vanished_repository, settle_orphaned_worktree
from orchestrator.worktree import Worktree
from orchestrator.worktree_removal import remove_worktree


def settle_worktree(config: Config, iteration: Any, log: Any, *, agent_began_at: datetime, agent_done_by: datetime) -> Any:
    """Roll the task's worktree back to the checkpoint; return the commit instead (a git.Commit, its dates read
    with it) if the iteration had committed, else None.

    What a person did there after the night died (after `agent_done_by`, the latest the dead iteration
    could have written) is theirs, as in a worktree no iteration ran in: commits they made on the
    branch stay on it (the next night builds on them), files they changed are kept on an
    `overnight-kept/` branch first. A worktree they detached to check the branch out elsewhere is
    left as it is (the night skips the task while they have it; the idle cleaning settles it after).

    A `.git` folder the agent made (`git init`) while it ran is undone; one made or moved there since, a person's
    repository, is left as it is (the night then skips the task)."""
    import git

    path = config.worktrees_dir / iteration.task_name
    if not path.exists():
        return None  # the worktree lives on another host, or was never created
    remove_git_locks(path, iteration.task_name, log)
    repo = git.Repo(config.repo_path)
    branch = branch_for(iteration.task_name)
    head = branch_tip(repo, branch) or ""
    made = _iteration_commit_at(repo, head, iteration) if head and head != iteration.checkpoint else None
    if of_a_vanished_repository(repo, path):  # the clone the dead night worked in is gone (a CI workspace)
        settle_orphaned_worktree(config, repo, path, log)
        return made
    own_repository = is_a_repository_of_its_own(path)
    if own_repository and not made_while_the_agent_ran(path, agent_began_at, agent_done_by):
        log.warning("worktree_folder_kept", task=iteration.task_name, at=str(path),
                    why="a repository of its own (its .git is a folder), not made by the agent: left as it is")
        return made
    # The agent's `git init`, or a link it broke: the registration is this repository's (no link names it, and a state
    # dir kept outside the repository has none above it: recovery failed the whole night, every night, for it).
    common = Path(repo.common_dir)
    if own_repository:
        worktree = Worktree(path, branch, config.repo.keep, common_dir=common)
    else:
        admin = admin_dir_for_recovery(path, common)
        if admin is not None and (other := common_of(admin)) != common.resolve():
            # Another repository's worktree (a person's `git worktree add` there since the night died, the original's
            # after `cp -r` of the repository), as the night leaves it: rolled back through that repository, which may
            # lack the checkpoint, it was removed, a person's edits with it.
            log.warning("worktree_folder_kept", task=iteration.task_name, at=str(path),
                        why=f"a worktree of another repository ({other}): left as it is")
            return made
        worktree = Worktree(path, branch, config.repo.keep, admin=admin)
    with contextlib.suppress(Exception):  # a worktree git cannot read is rebuilt below, as before
        if (elsewhere := worktree.held_elsewhere()) is not None:
            log.warning("worktree_not_rolled_back", task=iteration.task_name, why=f"its branch is checked out in {elsewhere}")
            return made
    target = made.hexsha if made is not None else iteration.checkpoint
    if head and head != target and _committed_after(repo, target, head, agent_done_by):
        target = head
        log.warning("worktree_commits_left", task=iteration.task_name, commit=head[:12])
    if _changed_after(worktree, agent_done_by):
        keep_what_a_person_may_have_written(worktree, iteration.task_name, config, log, onto=target)
    try:
        worktree.rollback(target)
    except Exception as exc:  # a worktree too broken for git: rebuilt from its branch by the next night
        remove_worktree(config, repo, path, log, why=f"{type(exc).__name__}: {exc}")
        if head and target != head:
            with contextlib.suppress(git.GitCommandError):  # a checkpoint this clone lacks: the branch stays
                repo.git.branch("-f", branch, target)
    return made


def _iteration_commit_at(repo: Any, head: str, iteration: Any) -> Any:
    """The commit (a git.Commit) this iteration made: `head`, or below commits a person added on it since
    (first parents, down to the checkpoint); None if it made none."""
    for commit in repo.iter_commits(head, first_parent=True, max_count=_PERSON_COMMITS_LOOKED_THROUGH):
        if commit.hexsha == iteration.checkpoint:
            break
        if _is_iteration_commit(repo, commit, iteration):
            return commit
    return None


# How many commits a person may have added on an iteration's commit for it still to be found.
_PERSON_COMMITS_LOOKED_THROUGH = 50


def _committed_after(repo: Any, base: str, head: str, moment: datetime) -> bool:
    """Whether a commit on `head` and not on `base` was made after `moment`: a person's, since the
    night died (the agent's own commits of the killed iteration are older)."""
    import git

    after = moment.timestamp()
    try:
        return any(commit.committed_date > after for commit in repo.iter_commits(f"{base}..{head}", max_count=1000))
    except git.GitCommandError:  # a checkpoint this clone lacks: nothing to tell them apart by
        return False


def _changed_after(worktree: Worktree, moment: datetime) -> bool:
    """Whether a file that differs from HEAD (not ignored, not `keep`) was written, or moved there, after `moment`;
    False when git cannot tell (the rollback then rebuilds the worktree, as it did)."""
    try:
        changed = worktree.uncommitted_paths()
    except Exception:
        return False
    after = moment.timestamp()
    for relative in changed:
        with contextlib.suppress(OSError):  # deleted: nothing there to keep
            found = (worktree.path / relative.rstrip("/")).lstat()
            # A move keeps a file's mtime (a person's notes from the evening before, moved in): its ctime, which
            # the kernel sets and no tool sets back, says when it came. Without it the rollback deleted the file.
            if max(found.st_mtime, found.st_ctime) > after:
                return True
    return False


def _is_iteration_commit(repo: Any, commit: Any, iteration: Any) -> bool:
    """`commit` is the one this iteration made (only ever after its check passed), on its checkpoint:
    right on it, or on commits the agent made on top of it (the commit keeps those, `Worktree.commit`)."""
    return (
        commit.author.name == "overnight"
        and commit.summary == f"overnight: {iteration.task_name} iteration {iteration.number}"
        and ([parent.hexsha for parent in commit.parents] == [iteration.checkpoint] or repo.is_ancestor(iteration.checkpoint, commit.hexsha))
    )
