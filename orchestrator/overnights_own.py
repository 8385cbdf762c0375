"""What in a state dir overnight made itself, told from a person's things of the same place: a state dir such as `~/code`
also holds their own `worktrees/<name>` (a worktree of the same repository) or `transcripts/<name>.jsonl`. A night's and
`overnight gc`'s clean-ups delete, roll back or remove only what these say is overnight's.

A transcript is named as iteration.py names it, `task-run-<task run id>-<task>-<iteration>.jsonl` (`.<n>` before
`.jsonl` where transcript.py found that name taken). A task's worktree is `worktrees/<task>` on `overnight/<task>`, or
off it (a person detached it for a review, or deleted its branch) once a night marked it as the task's: a file in its
registration, git's folder for it in the repository's .git, which `git worktree remove` deletes with it. One an older
version made, unmarked, is told by its HEAD log instead: it was checked out off the task's branch.
"""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.branch_holders import head_file
from orchestrator.files import read_regular_file, replace_file
from orchestrator.task_branches import branch_for

# The task's name as task_section allows it.
_TRANSCRIPT_NAME = re.compile(r"task-run-[0-9]+-[A-Za-z0-9][A-Za-z0-9._-]{0,63}-[0-9]+(?:\.[0-9]+)?\.jsonl")
TASK_MARK = "overnight-task"
# More than any task name (64 characters): a mark that is longer is not one a night wrote.
_MARK_MOST_READ = 256
# A HEAD log's first lines: a worktree detached after more commits than fit stays unrecognised, and so is left alone.
_LOG_MOST_READ = 4 << 20


def is_a_transcript_name(name: str) -> bool:
    return _TRANSCRIPT_NAME.fullmatch(name) is not None


def mark_as_task_worktree(admin: Path, task: str) -> None:
    """Mark the worktree `admin` registers (its HEAD on the task's branch now) as `task`'s: read first, written once."""
    if _mark_of(admin) == task:
        return
    try:
        # Replaced, not written through: a link put there would have had its target overwritten.
        replace_file(admin / TASK_MARK, task.encode("utf-8"), sync=False)
    except OSError:
        pass  # unmarked, it is still the task's while on its branch, as every night leaves it


def first_checkout_cut_short(admin: Path) -> bool:
    """Whether the worktree `admin` registers is a first checkout cut short (a night cancelled or killed while it ran):
    no index, and no mark, which a night writes only once its first checkout is done (or an older version's worktree
    with no index, taken so as it always was). Marked, one with no index lost it since (a person, an agent or git
    deleted it), and what is in it may be someone's."""
    return not (admin / "index").exists() and _mark_of(admin) is None


def is_task_worktree(admin: Path, task: str) -> bool:
    """Whether the worktree `admin` registers, found at `worktrees/<task>`, is the task's: on its branch, or marked."""
    return head_file(admin) == f"ref: refs/heads/{branch_for(task)}" or _mark_of(admin) == task or _was_on_branch(admin, task)


def _was_on_branch(admin: Path, task: str) -> bool:
    """Whether the worktree's HEAD log says it left the task's branch (a checkout to detach it): what tells a worktree a
    night made before nights marked theirs (an older version's), detached for a review, from a person's."""
    try:
        log = read_regular_file(admin / "logs" / "HEAD", _LOG_MOST_READ)
    except OSError:
        return False
    return f"\tcheckout: moving from {branch_for(task)} to ".encode() in log


def _mark_of(admin: Path) -> str | None:
    """The task name the mark holds; None where there is none. Read only as a regular file, as HEAD is: a pipe put there
    held gc and the night's start for ever, waiting for a writer."""
    try:
        return read_regular_file(admin / TASK_MARK, _MARK_MOST_READ).decode("utf-8", errors="replace")
    except OSError:
        return None
