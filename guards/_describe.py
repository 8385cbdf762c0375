"""Small helpers for guard messages; calls are rendered by orchestrator.toolcalls."""

from __future__ import annotations

from orchestrator import toolcalls
from orchestrator.records import BrokenCall, ToolCall
from orchestrator.printable import shortened, visible

__all__ = ["describe_call", "first_lines", "name_for_message", "quoted", "times"]

# A tool name the model made up is quoted at most this long: one was 15,000 characters.
NAME_LIMIT = 60


def describe_call(call: ToolCall | BrokenCall) -> str:
    """A call's short one-line form, with any control character the model put in it escaped."""
    return visible(toolcalls.describe_call(call))


def quoted(name: str, limit: int = NAME_LIMIT) -> str:
    """A model-chosen name as its repr (control characters escaped), cut to `limit` characters."""
    return repr(name[:limit]) + ("…" if len(name) > limit else "")


def name_for_message(name: str) -> str:
    """A model-chosen name for a signal message: as it is when short and printable, else `quoted`."""
    return name if len(name) <= NAME_LIMIT and name.isprintable() else quoted(name)


def times(count: int) -> str:
    """" ×3" from the second occurrence on, so a first sighting reads plainly."""
    return f" ×{count}" if count > 1 else ""


def first_lines(output: str, count: int) -> str:
    """The first `count` lines of a tool's output, each shortened and made visible, for a note's evidence."""
    return "\n".join(visible(shortened(line, 200)) for line in output.strip().splitlines()[:count])
