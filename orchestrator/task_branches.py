"""What a task's branches are called, and the refusal when another checkout holds one.

`overnight/<task>` is the branch a task's worktree commits on; `overnight-kept/<task>/<UTC time>`
keeps what a person left in a task's worktree (recovery and `Worktree.back_on_branch` make them).
"""

from __future__ import annotations

from datetime import datetime, timezone

from orchestrator.errors import ConfigError

BRANCH_PREFIX = "overnight/"
# Branches that keep what a person left in a task's worktree (recovery and back_on_branch make them).
KEPT_BRANCH_PREFIX = "overnight-kept/"


class BranchCheckedOut(ConfigError):
    """The task's branch is checked out in another worktree (most often the user's checkout, for
    review): the night may neither move that checkout's HEAD nor build on a stale copy of the branch."""

    def __init__(self, task: str, branch: str, at: str) -> None:
        super().__init__(
            f"task {task!r}: its branch {branch} is checked out in {at}; switch that checkout to another branch "
            "(or detach it) and the next night works on the task again"
        )
        self.at = at


def branch_for(task: str) -> str:
    return BRANCH_PREFIX + task


def kept_branch(task: str) -> str:
    """A new `overnight-kept/<task>/<UTC time>` branch name."""
    return f"{KEPT_BRANCH_PREFIX}{task}/{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S.%fZ')}"
