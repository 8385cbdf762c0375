"""Small helpers for guard messages; calls are rendered by orchestrator.toolcalls."""

from __future__ import annotations

from orchestrator.toolcalls import describe_call

__all__ = ["describe_call", "times"]


def times(count: int) -> str:
    """" ×3" from the second occurrence on, so a first sighting reads plainly."""
    return f" ×{count}" if count > 1 else ""
