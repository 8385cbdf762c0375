"""The code fences in a model's answer, each with its language and body; a fence that may hold a call ends after the
JSON that starts its lines, not at a ``` inside one of its strings (or is said to be cut there)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

from orchestrator.strict_json import json_error, raw_decode

# Fence languages a model uses for a call; a ```python fence is never a call.
CALL_FENCE_LANGUAGES = {"", "json", "json5", "jsonc", "tool_call", "tool", "tool_code", "function"}
# A JSON value whose first key is double-quoted: `{"name"` or `[{"name"`.
_DOUBLE_QUOTED_KEY = re.compile(r'[\[\s]*\{\s*"')
# Possessive (*+): a fence line with no line break after it fails at once instead of being
# re-split between the three parts in every way (quadratic in the reply's length).
FENCE = re.compile(r"```[ \t]*+([\w+-]*+)[^\n]*+\n(.*?)(?:```|\Z)", re.DOTALL)
FENCE_MARK = "```"
JSON_START = re.compile(r"^[ \t]*([\[{])", re.MULTILINE)


@dataclass(frozen=True)
class CutJson:
    """Invalid JSON in a fence's body that the ``` closing the fence cut inside one of its strings."""

    start: int  # where in the body it begins
    text: str
    error: str


@dataclass(frozen=True)
class Fence:
    """One code fence's language and body."""

    language: str
    body: str
    cut: CutJson | None = None


def fences(text: str) -> Iterator[Fence]:
    position = 0
    while (match := FENCE.search(text, position)) is not None:
        fence, position = fence_at(text, match)
        yield fence


def fence_at(text: str, match: re.Match[str]) -> tuple[Fence, int]:
    """The fence that `match` opens, and where the text after it starts.

    The regex ends a fence at the first ```, but a call that writes a README or a
    docstring holds ``` in its strings. So the JSON values starting the body's lines
    are decoded from the whole text first, and the fence ends at the first ``` after them.
    """
    language, start, close = match.group(1), match.start(2), match.end(2)
    if language.lower() not in CALL_FENCE_LANGUAGES:  # ```python, ```c: code shown, never a call
        return Fence(language, text[start:close]), min(close + len(FENCE_MARK), len(text))
    position = start
    while (value := JSON_START.search(text, position, close)) is not None:
        try:
            _, position = raw_decode(text, value.start(1))
        except ValueError as exc:
            # Only JSON quoted as JSON can be judged cut inside a string: a Python dict's
            # 'strings' may hold a lone ", which is no string of JSON's (27" wide).
            json_quoted = _DOUBLE_QUOTED_KEY.match(text, value.start(1)) is not None
            if close < len(text) and json_quoted and _ends_inside_a_string(text[value.start(1) : close]):
                cut = CutJson(value.start(1) - start, text[value.start(1) : close], json_error(exc, value.start(1)))
                return Fence(language, text[start:close], cut), close + len(FENCE_MARK)
            position = value.end()
            continue
        if position > close:  # only a ``` inside a string can lie within valid JSON
            found = text.find(FENCE_MARK, position)
            close = found if found >= 0 else len(text)
    return Fence(language, text[start:close]), min(close + len(FENCE_MARK), len(text))


def _ends_inside_a_string(json_text: str) -> bool:
    inside = escaped = False
    for char in json_text:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = inside
        elif char == '"':
            inside = not inside
    return inside
