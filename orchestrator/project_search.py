"""The `search` tool run: the lines matching the model's pattern in the files at a path, found file by file until
too many match or search's time is spent. Which files it looks in and what it answers are search_tool.py's; the
lines that match in one file, search.py's."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

from orchestrator import search
from orchestrator.records import ToolResult
from orchestrator.search_tool import (
    MAX_SEARCH_MATCHES, Skipped, files_under, ignored_under, search_answer, search_content, search_out_of_time, search_too_many_matches,
)
from orchestrator.tool_paths import ToolPaths
from orchestrator.tool_refusal import Refused

_SEARCH_LINE_CHARS = 200


def search_project(paths: ToolPaths, pattern: str, path: str, *, cancel: Any, redact: Callable[[str], str]) -> ToolResult:
    """The `search` tool: the lines matching `pattern` in the files at `path`, the whole project by default."""
    if not pattern:
        raise Refused("the pattern is empty; give the text or regular expression to look for")
    path = path if path.strip() else "."  # "" is how many small models say "the whole project"
    matcher = _search_matcher(pattern)
    target, named_content = _search_target(paths, path)
    return _search_files(paths.root, target, named_content, matcher, pattern, path, cancel, redact)


def _search_matcher(pattern: str) -> search.Matcher:
    """`pattern` compiled for search; refused when its counted repeats make it too big to compile."""
    try:
        return search.Matcher.of(search.compile_pattern(pattern))
    except search.PatternTooBig:
        raise Refused(
            f"the pattern {pattern!r} repeats too much to compile (over {search.MOST_UNROLLED_COPIES} copies "
            "by its counted repeats like {1000}); search for plain text, or use smaller counts"
        ) from None


def _search_target(paths: ToolPaths, path: str) -> tuple[Path, bytes | None]:
    """Where to search, and a file's bytes when `path` names a file (read once, to tell why search
    skips it if it does); refused when `path` is not there, or names a file search skips."""
    target = paths.resolve(path)
    if not target.exists():
        raise Refused(f"not found: {path!r}; use \".\" to search the whole project")
    named_content = None if target.is_dir() else search_content(str(target), None)
    if isinstance(named_content, Skipped):
        # Asked for by name, a file search skips is no file without matches.
        raise Refused(f"{path!r} {named_content.reason}")
    return target, named_content


def _search_files(
    root: Path, target: Path, named_content: bytes | None, matcher: search.Matcher, pattern: str, path: str,
    cancel: Any, redact: Callable[[str], str],
) -> ToolResult:
    """The lines matching in the files at `target` (`path` as the model gave it), file by file, until
    MAX_SEARCH_MATCHES are passed or SEARCH_TIMEOUT_S is spent; refused when one file's text takes it."""
    ignored = ignored_under(root, target) if target.is_dir() else set()
    root_prefix = os.path.join(str(root), "")
    deadline = time.monotonic() + search.SEARCH_TIMEOUT_S
    matches: list[str] = []
    searched = 0
    try:
        for file, info in files_under(root, target, ignored):
            if cancel is not None:
                cancel.raise_if_cancelled()
            now = time.monotonic()
            if now > deadline and searched:
                # Many files (a large project searched from its top): what was found so far,
                # and how to make the next search quicker. The first file is always searched:
                # listing a large folder can take the whole time on a slow disk or host.
                return search_out_of_time(matches, searched)
            # A file begun near the end still gets a moment of its own (files over 2 MB are skipped).
            room = max(deadline, now + search.FILE_MIN_TIME_S)
            # A file asked for by name was read once, to tell why it is skipped, if it is.
            content = search_content(file, info) if named_content is None else named_content
            if not isinstance(content, Skipped):
                matches.extend(_matches_in(root_prefix, file, content, matcher, MAX_SEARCH_MATCHES + 1 - len(matches), room, redact))
            searched += 1
            if len(matches) > MAX_SEARCH_MATCHES:
                return search_too_many_matches(matches)
    except TimeoutError:  # inside one file's text: the pattern
        raise Refused(
            f"search stopped after {search.SEARCH_TIMEOUT_S:g}s: the pattern {pattern!r} backtracks too much; "
            "search for plain text, or a pattern without nested repeats like (a+)+"
        ) from None
    return search_answer(matches, pattern, path)


def _matches_in(
    root_prefix: str, file: str, data: bytes, matcher: search.Matcher, limit: int, deadline: float, redact: Callable[[str], str],
) -> list[str]:
    """`file:line: text` for the first `limit` matching lines of a text file's bytes; see orchestrator/search.py."""
    shown = file[len(root_prefix):] if file.startswith(root_prefix) else os.path.basename(file)
    lines = matcher.lines_in(data, limit, deadline)
    # Indentation kept: a model copies these lines into edit_file's `old`. Redacted before the cut to
    # _SEARCH_LINE_CHARS: a secret the cut splits (a long line of JSON) left its first part.
    return [f"{shown}:{number}: {redact(line.rstrip())[:_SEARCH_LINE_CHARS]}" for number, line in lines]
