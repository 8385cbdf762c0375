"""A git operation the agent's commands left under way in a task's worktree, quit before overnight's commit or rollback.

Left there, each shaped what overnight's git did next: a merge (`git merge --no-commit`, or one stopped at a conflict)
made the iteration's commit a merge, its second parent one the person never asked for; a cherry-pick stopped at a
conflict gave the commit the picked commit's author, and recovery then did not know it for the iteration's; a rebase
sent the commit off the branch, and a `git am` stopped at a conflict failed the `rebase --quit` meant for a rebase,
and with it the rollback (exit 4). What `git reset --hard` leaves in place (the sequencer of a cherry-pick or revert of
several commits, a bisect) outlived the rollback and the commit: the next iteration's own cherry-pick failed
("already in progress"), and the worktree stayed "bisecting" into the next night. Each is quit as git quits it, HEAD,
files and index as they are: the commit then records the worktree exactly, on one parent, and the rollback resets it.

Where git refuses to quit (`bisect reset` checks HEAD out: not over a conflict, nor with the branch deleted; a marker
the agent wrote by hand: "No rebase in progress?") or leaves the marker (a folder where git keeps a file), overnight
removes the marker itself: left, it failed the commit and the rollback, and with them the night (exit 4). A marker that
is a link is removed, never given to git, whose quit empties the folder it leads to; and none is read but as a regular
file, and only its start: a pipe waited for a writer for ever, and /dev/zero filled the memory. The message git kept for
the commit it was making (MERGE_MSG, which `rebase --quit` and a marker removed by hand leave) goes too: an iteration that
commits nothing kept it, and the next one's `git commit` without -m (its editor `true`) took it for its own message.

A bisect that left HEAD on a commit without the checkpoint or the branch's tip (one of the commits it was searching, the
agent's own included), detached or on a branch the agent made there, is not committed: the commit would hold that older
commit's files on the branch's tip and so undo, unsaid, every commit after it.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Callable

from orchestrator.branch_holders import head_file
from orchestrator.errors import QualityError
from orchestrator.files import read_regular_file, remove_entry
from orchestrator.task_branches import BRANCH_PREFIX

# What git keeps in a worktree's own git dir while an operation is under way, the operation, and how git quits it
# leaving HEAD, files and index as they are (bisect: `reset HEAD` stays on the bisection's commit, files and all).
_UNDER_WAY = (
    ("rebase-merge", "rebase", ("rebase", "--quit")),
    ("rebase-apply/applying", "am", ("am", "--quit")),
    ("rebase-apply", "rebase", ("rebase", "--quit")),
    ("MERGE_HEAD", "merge", ("merge", "--quit")),
    ("CHERRY_PICK_HEAD", "cherry-pick", ("cherry-pick", "--quit")),
    ("REVERT_HEAD", "revert", ("revert", "--quit")),
    ("sequencer", "cherry-pick", ("cherry-pick", "--quit")),  # or revert, of several commits, past the one stopped at
    ("BISECT_START", "bisect", ("bisect", "reset", "HEAD")),
)


_COMMIT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
# What is read of a marker that names commits: about a hundred ids, more than any merge a person makes names.
_MOST_READ = 4096
# What git keeps for the commit an operation was making, which its quit may leave (`rebase --quit` does).
_COMMIT_MESSAGE_LEFT = ("MERGE_MSG", "MERGE_MODE")
# The first step left in a sequencer's todo, as git reads it to tell a revert from a cherry-pick ("revert <commit> ...").
_REVERT_STEP = re.compile(r"[ \t\r\n]*revert[ \t]")


def operation_under_way(admin: Path) -> str | None:
    """The first git operation under way in the worktree whose own git dir is `admin` ("rebase", "am", "merge"), or None."""
    return next((operation for marker, operation, _ in _UNDER_WAY if os.path.lexists(admin / marker)), None)


def quit_operations(git: Callable[..., str], admin: Path) -> list[str]:
    """Quit each operation under way in the worktree whose own git dir is `admin`; each one quit, described
    ("merge of 61c62490a1b2"). File checks; a process only for an operation found."""
    dropped: list[str] = []
    for marker, operation, command in _UNDER_WAY:
        if os.path.lexists(admin / marker):  # gone when an earlier quit ended it too
            dropped.append(_described(admin, marker, operation))
            state = admin / marker.split("/")[0]  # rebase-apply/applying: git's quit removes the folder
            if not state.is_symlink():
                _quit(git, command)
            if os.path.lexists(state):
                for left in _state_of(admin, state):
                    remove_entry(left)
    for left in _COMMIT_MESSAGE_LEFT if dropped else ():
        if os.path.lexists(admin / left):
            remove_entry(admin / left)
    return dropped


def refuse_bisect_behind(git: Callable[..., str], admin: Path, branch: str, base: str) -> None:
    """QualityError when a bisect under way has HEAD off `branch` (detached, or on a branch made or switched to since) on a
    commit that lacks `base` (the iteration's checkpoint) or the branch's tip (the agent's own commits, bisected too):
    committed on the branch, its files would undo what came after that commit. A file check; processes only in a bisect."""
    if not os.path.lexists(admin / "BISECT_START"):
        return
    head = head_file(admin)
    if not head:  # unreadable: no answer, and the commit goes on as before
        return
    if head == f"ref: refs/heads/{branch}":
        return  # back on the task's branch, its files checked out: the bisect's commit is no longer what is committed
    for kept, named in ((base, "the checkpoint"), (f"refs/heads/{branch}", "the branch's tip")):
        # HEAD as git resolves it: `git switch -c` at the bisect's commit left the same files on a branch of their own.
        if _lacks(git, kept, "HEAD"):
            left_on = git("rev-parse", "--verify", "HEAD")[:12]
            raise QualityError(
                "iteration_error",
                "You left a `git bisect` under way with an older commit checked out, so your changes were made to that "
                "commit's files; committed on the branch they would have undone its later commits, so they were undone "
                "instead. End a bisect with `git bisect reset` before you change files.",
                evidence=f"bisect left on {left_on}, which lacks {named} {git('rev-parse', '--verify', kept)[:12]}",
                message=f"bisect left on {left_on}",
            )


def _lacks(git: Callable[..., str], ancestor: str, commit: str) -> bool:
    """True when `commit` does not hold `ancestor`; False also when git cannot tell (a branch deleted, objects missing):
    the commit then goes on as before."""
    import git as gitpython

    try:
        git("merge-base", "--is-ancestor", ancestor, commit)
    except gitpython.GitCommandError as exc:
        return exc.status == 1  # 1: not an ancestor; anything else is no answer
    return False


def _quit(git: Callable[..., str], command: tuple[str, ...]) -> None:
    """git's own quit; its refusal, and its kill at the time limit (a pipe the agent put in the state, waited on), left to
    the marker's removal. A git the night's signal ended (SIGTERM, SIGINT, SIGHUP) is raised: the night's to handle."""
    import git as gitpython

    try:
        git(*command)
    except gitpython.GitCommandError as refused:
        if not isinstance(refused.status, int) or (refused.status < 0 and refused.status != -signal.SIGKILL):
            raise


def _state_of(admin: Path, state: Path) -> list[Path]:
    """What is removed of an operation git did not quit: `state`, the marker, and for a bisect its log (`git status` said
    "bisecting" while BISECT_LOG was there) and refs, as `git bisect reset` removes them. One folder listed, for a bisect."""
    if state.name != "BISECT_START":
        return [state]
    refs = admin / "refs" / "bisect"
    return [*admin.glob("BISECT_*"), *([refs] if os.path.lexists(refs) else [])]


def log_operations_quit(branch: str, dropped: list[str], before: str) -> None:
    """`worktree_operation_dropped`: what the agent's git had left under way, quit `before` a commit or rollback."""
    from orchestrator.logs import get_logger

    get_logger().warning("worktree_operation_dropped", task=branch.removeprefix(BRANCH_PREFIX), operations=dropped, before=before)


def with_operations_quit(message: str, dropped: list[str]) -> str:
    """The commit's message, telling the morning's reader what the agent's git left under way and overnight quit."""
    return (
        f"{message}\n\nLeft under way by the agent's git and dropped: {'; '.join(dropped)}. This commit has one parent"
        " and holds the worktree's files as the check passed them."
    )


def _described(admin: Path, marker: str, operation: str) -> str:
    """`operation`, with the commits it named ("merge of 61c62490a1b2") when `marker` is a file of them."""
    if marker == "sequencer":
        return _sequencer_operation(admin)
    if marker not in ("MERGE_HEAD", "CHERRY_PICK_HEAD", "REVERT_HEAD"):
        return operation
    try:
        words = read_regular_file(admin / marker, _MOST_READ).decode(errors="replace").split()
    except OSError:  # a folder, a pipe, a device: none names a commit
        return operation
    # Commit ids only: the file is the agent's to write, and what it says goes into the commit's message unredacted.
    commits = [word[:12] for word in words if _COMMIT_ID.fullmatch(word)]
    return f"{operation} of {', '.join(commits)}" if commits else operation


def _sequencer_operation(admin: Path) -> str:
    """"revert" when the sequencer's next step reverts (git keeps one sequencer for `revert A B` and `cherry-pick A B`,
    and its `status` tells them apart by that step), else "cherry-pick". Never read through a link."""
    if (admin / "sequencer").is_symlink():
        return "cherry-pick"
    try:
        todo = read_regular_file(admin / "sequencer" / "todo", 256).decode(errors="replace")
    except OSError:  # a sequencer the agent made a file, a todo it removed
        return "cherry-pick"
    return "revert" if _REVERT_STEP.match(todo) else "cherry-pick"
