"""Calls written as bare JSON: a value starting a line, and those after it on the same line (`{...}; {...}`)."""

from __future__ import annotations

import re

from orchestrator.broken_calls import MENDED_CALLS_TRIED, calls_in_unreadable_json
from orchestrator.call_shapes import WrittenCall, written_from_value
from orchestrator.code_fences import JSON_START
from orchestrator.json_block_calls import calls_in_block
from orchestrator.strict_json import raw_decode


def calls_in_bare_json(text: str, known: set[str], cut: bool) -> list[WrittenCall]:
    """JSON objects starting a line, and those after them on the same line (`{...}; {...}`); one cut off at the end of
    a truncated answer counts too."""
    found: list[WrittenCall] = []
    resume = 0
    tries_left = [MENDED_CALLS_TRIED]
    for match in JSON_START.finditer(text):
        start = match.start(1)
        if start < resume:
            continue
        position = start
        while True:
            try:
                value, after = raw_decode(text, position)
            except ValueError as exc:
                if cut:
                    return found + calls_in_block(text[position:], known, cut)
                # After a call on its line as on a line of its own: mended, read whole, or cut off, not dropped.
                calls, resume = calls_in_unreadable_json(text, position, exc, known, tries_left)
                found.extend(calls)
            else:
                shapes = written_from_value(value, text[position:after], "", known, cut)
                if position > start and not shapes:
                    break
                found.extend(shapes or [])
                resume = after
            # Llama 3 writes several calls on one line: `{...}; {...}`.
            more = _NEXT_ON_THE_LINE.match(text, resume)
            if more is None:
                break
            position = more.end()
    return found


# What may stand between calls on one line: Llama 3's `; `, a comma, a space, nothing.
_NEXT_ON_THE_LINE = re.compile(r"[ \t]*[;,]?[ \t]*(?=[\[{])")
