"""What in a state dir overnight made itself, told from a person's things of the same place: a state dir such as `~/code`
also holds their own `worktrees/<name>` (a worktree of the same repository) or `transcripts/<name>.jsonl`. A night's and
`overnight gc`'s clean-ups delete, roll back or remove only what these say is overnight's.

A transcript is named as iteration.py names it, `task-run-<task run id>-<task>-<iteration>.jsonl` (`.<n>` before
`.jsonl` where transcript.py found that name taken). A task's worktree is `worktrees/<task>` on `overnight/<task>`, or
off it (a person detached it for a review, or deleted its branch) once a night marked it as the task's: a file in its
registration, git's folder for it in the repository's .git, which `git worktree remove` deletes with it.
"""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.branch_holders import head_file
from orchestrator.task_branches import branch_for

# The task's name as task_section allows it.
_TRANSCRIPT_NAME = re.compile(r"task-run-[0-9]+-[A-Za-z0-9][A-Za-z0-9._-]{0,63}-[0-9]+(?:\.[0-9]+)?\.jsonl")
TASK_MARK = "overnight-task"


def is_a_transcript_name(name: str) -> bool:
    return _TRANSCRIPT_NAME.fullmatch(name) is not None


def mark_as_task_worktree(admin: Path, task: str) -> None:
    """Mark the worktree `admin` registers (its HEAD on the task's branch now) as `task`'s: read first, written once."""
    mark = admin / TASK_MARK
    try:
        if mark.read_text(encoding="utf-8") == task:
            return
    except OSError:
        pass
    try:
        mark.write_text(task, encoding="utf-8")
    except OSError:
        pass  # unmarked, it is still the task's while on its branch, as every night leaves it


def is_task_worktree(admin: Path, task: str) -> bool:
    """Whether the worktree `admin` registers, found at `worktrees/<task>`, is the task's: on its branch, or marked."""
    if head_file(admin) == f"ref: refs/heads/{branch_for(task)}":
        return True
    try:
        return (admin / TASK_MARK).read_text(encoding="utf-8") == task
    except OSError:
        return False
