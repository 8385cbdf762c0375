"""The run store: a record of every night, task, iteration and event, in SQL."""

from __future__ import annotations

from runs.store import RunStore
from runs.views import EarlierTonight, IterationView, LeaseView, RunView, TaskView, worst_signal

__all__ = ["RunStore", "RunView", "TaskView", "IterationView", "LeaseView", "EarlierTonight", "worst_signal"]
