"""What a night's `[night] deadline` did, as the morning's report tells it: when it was, and which tasks it ended.

A task the deadline ended is `cancelled`, reason `deadline`: cut short when it had begun an iteration (the one in
flight cancelled at the deadline, or the next refused as unable to finish by then), not started when it had none.
Told apart from a failure at a glance, and without reading every task's line. A task another worker sharing the store
held when the deadline came is neither: it is `skipped` (`leased`, or `done_elsewhere`), never this night's to start.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from runs.views import RunView

# A cancelled task's reason when the deadline ended it (night_state.Night.why_not_start_iteration, the watcher's cancel).
DEADLINE = "deadline"


@dataclass(frozen=True)
class DeadlineCuts:
    """A night's deadline and the tasks it ended, in the config's order."""

    # None where the run kept no instant: recorded by a version before runs kept it.
    at: datetime | None
    cut_short: tuple[str, ...]
    not_started: tuple[str, ...]

    @property
    def ended_any(self) -> bool:
        """Whether it ended a task: only then do the CI reports name it (a night done before its deadline owes it nothing)."""
        return bool(self.cut_short or self.not_started)

    def as_json(self) -> dict[str, Any]:
        return {"at": self.at.isoformat() if self.at else None, "cut_short": list(self.cut_short), "not_started": list(self.not_started)}


def deadline_cuts(run: RunView) -> DeadlineCuts | None:
    """The run's deadline and what it ended; None for a night that had no deadline (none recorded, no task ended by one)."""
    ended = [task for task in run.tasks if task.outcome == "cancelled" and task.reason == DEADLINE]
    if run.deadline is None and not ended:
        return None
    return DeadlineCuts(
        at=run.deadline,
        cut_short=tuple(task.name for task in ended if task.iterations),
        not_started=tuple(task.name for task in ended if not task.iterations),
    )
