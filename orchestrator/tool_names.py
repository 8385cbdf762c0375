"""The agent's tools by name: every one there is, the ones a task gets unless it says, and a list checked against them."""

from __future__ import annotations

from typing import Sequence

ALL_TOOLS = ("read_file", "write_file", "edit_file", "list_dir", "search", "run_check", "submit", "run_command")
DEFAULT_TOOLS = tuple(t for t in ALL_TOOLS if t != "run_command")


def check_tool_names(names: Sequence[str]) -> Sequence[str]:
    """ValueError naming the first of `names` that is no tool."""
    unknown = [name for name in names if name not in ALL_TOOLS]
    if unknown:
        raise ValueError(f"unknown tool {unknown[0]!r}; tools are {', '.join(ALL_TOOLS)}")
    return names
