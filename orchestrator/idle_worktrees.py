"""The worktrees no dead iteration was running in, cleaned for the night: under the state lock nobody
works in them, so what is uncommitted there is debris of a death, or a person's edits, kept first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.config import Config
from orchestrator.dot_git import DotGitKind, dot_git
from orchestrator.git_errors import git_reason
from orchestrator.git_locks import remove_git_locks
from orchestrator.gitdir import admin_dir, head_commit, is_worktree_of, linked_admin_dir
from orchestrator.kept_edits import keep_what_a_person_may_have_written
from orchestrator.overnights_own import first_checkout_cut_short, is_task_worktree
from orchestrator.ref_storage import RefsUnreadable
from orchestrator.repository import open_repo
from orchestrator.task_branches import branch_for, kept_branch
from orchestrator.vanished_repository import of_a_vanished_repository, settle_orphaned_worktree
from orchestrator.worktree import Worktree
from orchestrator.worktree_registration import repair_moved
from orchestrator.worktree_removal import remove_worktree, set_aside


def clean_idle_worktrees(config: Config, *, skip: set[str], log: Any) -> None:
    """Under the state lock nobody works in these: anything uncommitted is debris of a death.

    Only what overnight made is touched: the tasks' worktrees of this repository (overnights_own.py),
    and what a `git worktree add` killed half way leaves (an empty folder, or one holding only its
    `.git` link). Anything else found there (a person's folder, their own worktree of this
    repository, another repository's checkout) is left as it is.
    """
    root = config.worktrees_dir
    if not root.is_dir():
        return
    repo = open_repo(config.repo_path)
    tasks = {task.name for task in config.task}
    for path in sorted(p for p in root.iterdir() if p.name not in skip and p.is_dir() and not p.is_symlink()):
        repair_moved(repo, path)  # moved with the state dir: ours still, and what a person left there is kept
        if of_a_vanished_repository(repo, path):
            # A configured task's must go for its worktree to be made anew, as must a killed `worktree add`'s bare `.git`
            # link; any other may be a person's, of a clone of theirs since deleted.
            if path.name in tasks or [entry.name for entry in path.iterdir()] == [".git"]:
                settle_orphaned_worktree(config, repo, path, log)
            else:
                log.warning("worktree_folder_kept", task=path.name, why="a worktree of a repository that is gone, of no task: left as it is")
            continue
        relink_after_the_repository_moved(repo, path, config)
        if set_aside_without_its_link(repo, path, config, log):
            continue
        link = linked_admin_dir(repo, path)
        if link is None or not is_worktree_of(repo, path):
            contents = [entry.name for entry in path.iterdir()]
            if not contents or (contents == [".git"] and link is not None):
                remove_worktree(config, repo, path, log, why="creation was interrupted")
            else:
                log.warning("worktree_folder_kept", task=path.name, why="not a worktree of this repository: left as it is")
            continue
        # A configured task's folder is where its worktree is, whatever a person left it on: the night works there.
        if path.name not in tasks and not is_task_worktree(link, path.name):
            log.warning("worktree_folder_kept", task=path.name, why="a worktree of this repository that overnight did not make: left as it is")
            continue
        remove_git_locks(path, path.name, log)
        if path.name in tasks and first_checkout_cut_short(link):
            # A first checkout cut short (a night cancelled or killed while it ran): nothing in it is anyone's, and the
            # night's Worktree.ensure checks it out whole (first_checkout.py), where a cancel stops it. Cleaned here,
            # it was checked out twice (a status, a reset and a clean of every file), none of it stopped by a signal.
            # Marked (checked out whole once), its index was lost since: a person's edits there are kept first, below.
            continue
        try:
            worktree = Worktree(path, branch_for(path.name), config.repo.keep)
            if worktree.held_elsewhere() is not None:
                continue  # detached for the person's review of the branch: the night skips the task (BranchCheckedOut)
            state = worktree.idle_state()
        except RefsUnreadable:  # refs git cannot read (most often the repository's, every worktree's): none set aside for them
            raise
        except Exception as exc:  # a broken index, say: whether a person's edits are in it is unknown
            set_aside(config, repo, path, link, log, why=git_reason(exc))
            continue
        if state == "clean":
            continue
        if state == "changed":  # files git ignores are nobody's work to keep (and keep_changes takes none)
            keep_what_a_person_may_have_written(worktree, path.name, config, log)
        try:
            worktree.rollback("HEAD")
            log.info("worktree_cleaned", task=path.name)
        except Exception as exc:
            remove_worktree(config, repo, path, log, why=f"{type(exc).__name__}: {exc}")


def relink_after_the_repository_moved(repo: Any, path: Path, config: Config) -> None:
    """A worktree this repository registers whose `.git` link names a git dir no longer there: the repository was moved
    (its registration names the folder still, the folder's link the old `.git`). Linked again, as the night's
    `Worktree.ensure` would link it, before it is judged: left out as "not a worktree of this repository", what a person
    changed there was not kept, and the night's first rollback deleted it.

    Only then: a `.git` folder (a person's clone where a task's worktree was deleted without `git worktree prune`) would
    be replaced by the link, its history with it, and a link to a git dir still there (a worktree of the repository this
    one was copied from) would be taken from that repository."""
    if dot_git(path).kind is not DotGitKind.LINK_TO_GONE:
        return
    admin = admin_dir(path, Path(repo.common_dir))
    if admin is not None:
        Worktree(path, branch_for(path.name), config.repo.keep, common_dir=Path(repo.common_dir), admin=admin)  # relinks


def set_aside_without_its_link(repo: Any, path: Path, config: Config, log: Any) -> bool:
    """A configured task's folder, this repository's registration naming it, holding files but a `.git` that is no link
    (overwritten) or none (deleted): set aside whole, and True. No dead iteration ran there (recovery settles those
    first), so a person did it: maybe their own files where they deleted the task's worktree (no `git worktree prune`).

    Not relinked and cleaned: the clean deleted what no branch keeps (files git ignores, a repository inside), and
    the night relinked it through the registration and worked there. Set aside (commits on its detached HEAD kept on a
    branch first), nothing is lost and the night makes the task's worktree anew. A folder of no configured task no night touches: left as it is."""
    if dot_git(path).kind not in (DotGitKind.NO_LINK, DotGitKind.MISSING) or path.name not in {task.name for task in config.task}:
        return False
    if not any(entry.name != ".git" for entry in path.iterdir()):
        return False  # nothing of anyone's: an empty folder is what a killed `git worktree add` left, removed below
    admin = admin_dir(path, Path(repo.common_dir))
    if admin is None:
        return False  # no registration to relink it to: the night refuses it, as before
    _keep_a_head_off_its_branch(repo, admin, path.name, log)
    set_aside(config, repo, path, admin, log, why="its .git link was deleted or overwritten, not by a night at work there")
    return True


def _keep_a_head_off_its_branch(repo: Any, admin: Path, task: str, log: Any) -> None:
    """Commits a person made on the worktree's detached HEAD, which only its registration (removed with the folder) holds:
    on `overnight-kept/<task>/<UTC time>` first, as the night's `back_on_branch` keeps them."""
    import git

    head = head_commit(admin, Path(repo.common_dir))
    if head is None:
        return
    try:
        repo.git.merge_base("--is-ancestor", head, branch_for(task))
        return
    except git.GitCommandError:  # not on the branch, or no such branch
        pass
    kept = kept_branch(task)
    repo.git.branch(kept, head)
    log.warning("worktree_commits_kept", task=task, branch=kept)
