"""JSON with the slips small models make mended before it is parsed strictly, no repair library involved.

Two slips are mended exactly: a backslash JSON does not know (a regex's `\\d` written as is) and a comma before a
closing bracket. A JSON5-like object or array (single quotes, bare keys, Python's None, the model's words after it, its
closing brackets missing though every value is whole) is written as JSON by orchestrator/loose_json.py, its slips
mended, then parsed strictly (orchestrator/strict_json.py).
"""

from __future__ import annotations

import re
from typing import Any

from orchestrator import loose_json
from orchestrator.strict_json import loads


def slips_mended(text: str) -> str:
    """`text` with its stray backslashes escaped and its trailing commas (outside strings) taken out."""
    return _STRING_OR_TRAILING_COMMA.sub(_keep_strings, _STRAY_BACKSLASH.sub(r"\1\\\\", text))


# A backslash that starts no escape JSON knows (an even run of backslashes before it is escapes of its own).
_STRAY_BACKSLASH = re.compile(r'(?<!\\)((?:\\\\)*)\\(?=[^"\\/bfnrtu])')
# A string, kept as it is (a Go file's `"b",\n}` written with raw newlines is content), or a comma then
# only white space before `}` or `]`, which goes. A string never closed (an answer cut off) runs to the
# end: else the scan started again at each of its escaped quotes, quadratic in a cut-off file.
_STRING_OR_TRAILING_COMMA = re.compile(r'("(?:[^"\\]|\\.)*(?:"|\Z))|,(\s*[}\]])')


def _keep_strings(match: re.Match[str]) -> str:
    return match.group(1) or match.group(2)


def read_loosely(text: str) -> Any:
    """`text`'s only object or array, written as JSON by loose_json (its open brackets closed when every value is
    whole), its slips mended, then parsed strictly; None when `text` holds no such value or that does not parse."""
    start = len(text) - len(text.lstrip())
    json_text = loose_json.only_value_as_json(text, start) if text.startswith(("{", "["), start) else None
    if json_text is None:
        return None
    try:
        return loads(slips_mended(json_text))
    except ValueError:
        return None


def json5_like_value_at(text: str, start: int) -> tuple[Any, int] | None:
    """The JSON5-like object or array at `start` (single quotes, bare keys, Python's None) and where it closes, read as
    JSON with its slips mended (see read_loosely): the repair would merge it with the values beside it, or end a
    single-quoted string at an apostrophe. None when it does not close, or its reading does not parse or names a key twice
    (then read with the rest, its calls are broken: see loose_json.repeated_key)."""
    read = loose_json.closed_value_as_json(text, start) if text.startswith(("{", "["), start) else None
    if read is None or loose_json.repeated_key(text[start : read[1]]):
        return None
    json_text, end = read
    try:
        return loads(slips_mended(json_text)), end
    except ValueError:
        return None
