"""An events row as the run store queues it, and the types of event it records.

Every row gives every column but the id, so one compiled statement serves all the inserts of a batch
(runs/event_batches.py); the store shifts its time onto its own clock before it queues it.
"""

from __future__ import annotations

from typing import Any

from orchestrator.surrogates import mend
from runs.models import utc_now

MODEL_CALL = "model_call"
TOOL_CALL = "tool_call"
SIGNAL = "signal"


def event_row(
    iteration_id: int, event_type: str, *, name: str = "", message: str = "", data: dict[str, Any] | None = None
) -> dict[str, Any]:
    """An events row with every column given, so all inserts share one compiled statement."""
    return {
        "iteration_id": iteration_id,
        "at": utc_now(),
        "type": event_type,
        # mend: a stray lone surrogate would fail the whole batch, and with it the night's store.
        "name": mend(name),
        "level": "",
        "message": mend(message),
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "latency_ms": 0,
        "ok": None,
        "data": data or {},
    }
