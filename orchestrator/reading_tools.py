"""The tools that show what is there: read_file (a file whole, or a range of its lines, as much of it as fits in one
output) and list_dir (a folder's entries)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from orchestrator.file_reading import (
    BINARY_SNIFF_BYTES, binary_message, cut_range, is_utf8, not_utf8_note, numbered_lines, read_on, whole_lines, with_note,
)
from orchestrator.gitdir import is_git
from orchestrator.records import ToolResult
from orchestrator.tool_paths import ToolPaths
from orchestrator.tool_refusal import Refused

# Room kept in a capped output for the words of the note that says how to read on (its path comes on top).
_NOTE_ROOM = 200


def read_file(
    paths: ToolPaths, path: str, start_line: int | None, end_line: int | None, *, max_output_chars: int, redact: Callable[[str], str],
) -> ToolResult:
    """The `read_file` tool: the file at `path`, or its lines `start_line` to `end_line`, in at most `max_output_chars`."""
    target = paths.existing_file(path)
    if start_line is None and end_line is None:
        return _read_whole(path, target, max_output_chars, redact)
    first = 1 if start_line is None else start_line
    if first < 1 or (end_line is not None and end_line < first):
        raise Refused("start_line counts from 1, and end_line may not be below it; give a range like start_line=1, end_line=40")
    return _read_lines(path, target, first, end_line, max_output_chars, redact)


def list_dir(paths: ToolPaths, path: str) -> ToolResult:
    """The `list_dir` tool: the names in the folder at `path`, folders ending in /, .git left out."""
    path = path if path.strip() else "."  # "" is how many small models say "the project"
    target = paths.resolve(path)
    if target.is_file():
        raise Refused(f"{path!r} is a file, not a folder; use read_file to see it")
    if not target.is_dir():
        raise Refused(f"folder not found: {path!r}; use list_dir on \".\" to see the project's top level")
    entries = sorted(
        entry.name + ("/" if entry.is_dir() else "") for entry in target.iterdir() if not is_git(entry.name)
    )
    return ToolResult(True, "\n".join(entries) if entries else f"({path} is empty)")


def _read_whole(path: str, target: Path, max_output_chars: int, redact: Callable[[str], str]) -> ToolResult:
    with open(target, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        # No more than can be shown: a log of gigabytes must not be read whole into memory.
        data = handle.read(4 * max_output_chars + BINARY_SNIFF_BYTES)
    if b"\0" in data[:BINARY_SNIFF_BYTES]:
        return ToolResult(False, binary_message(path, size))
    text = data.decode("utf-8", errors="replace")
    if not text:
        return ToolResult(True, f"({path} is empty)")
    complete = len(data) >= size
    warning = "" if is_utf8(data, complete=complete) else not_utf8_note(path)
    if len(text) + len(warning) <= max_output_chars and complete:
        return ToolResult(True, with_note(text, warning))
    length = f"{len(text)} chars" if complete else f"{size} bytes"
    # Redacted before the cut, as every output is (Toolbox.execute): a secret on a line the cut splits left its first part.
    shown = whole_lines(redact(text)[: max_output_chars - _NOTE_ROOM - len(path) - len(warning)])
    if "\n" not in shown:  # one line longer than the cap: nothing to read on from
        cut = f"[... {path} has {length}; only the first {len(shown)} chars are shown.]"
    else:
        last = shown.count("\n")
        cut = f"[... {path} has {length}; only lines 1-{last} are shown. {read_on(last + 1)}]"
    return ToolResult(True, with_note(shown, cut, warning))


def _read_lines(
    path: str, target: Path, first: int, last: int | None, max_output_chars: int, redact: Callable[[str], str],
) -> ToolResult:
    """Lines `first` to `last` (None: to the end), as many as fit in the output."""
    room = max_output_chars - _NOTE_ROOM - len(path) - len(not_utf8_note(path))
    shown: list[str] = []
    used = number = 0
    warning = ""
    with open(target, "rb") as handle:
        if b"\0" in handle.read(BINARY_SNIFF_BYTES):
            return ToolResult(False, binary_message(path, os.fstat(handle.fileno()).st_size))
        handle.seek(0)
        for number, line in numbered_lines(handle, longest=4 * max_output_chars):
            if number < first:
                continue
            if last is not None and number > last:
                break
            if not warning and not is_utf8(line, complete=line.endswith(b"\n")):
                warning = not_utf8_note(path)
            text = line.decode("utf-8", errors="replace")
            if used + len(text) > room:
                # Redacted before the cut: see _read_whole.
                return ToolResult(True, with_note(*cut_range(shown, first, number, redact(text), room), warning))
            shown.append(text)
            used += len(text)
    if number == 0:
        return ToolResult(True, f"({path} is empty)")
    if number < first:
        raise Refused(f"{path} ends at line {number}, so it has no line {first}; give a start_line from 1 to {number}")
    return ToolResult(True, with_note("".join(shown), warning))
