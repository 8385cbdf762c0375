"""JSON values one after another in one block of text (calls run together, a line each or `{...}; {...}`): the values
that read, as JSON or JSON5-like, the first that does not, and whether that one was cut off.
"""

from __future__ import annotations

from typing import Any

from orchestrator.cut_off_json import text_ends_mid_value
from orchestrator.loose_json import BETWEEN_VALUES
from orchestrator.mended_json import json5_like_value_at, slips_mended
from orchestrator.strict_json import json_error, raw_decode


def values_one_after_another(block: str) -> tuple[list[tuple[Any, str]], tuple[int, ValueError] | None]:
    """The JSON values `block` holds one after another, each with its text, up to the first that does not read, as JSON
    or as a JSON5-like value (see mended_json.json5_like_value_at), and where that one starts with its JSON error (None
    when all of `block` reads)."""
    values: list[tuple[Any, str]] = []
    position = 0
    while position < len(block):
        try:
            value, end = raw_decode(block, position)
        except ValueError as exc:
            loose = json5_like_value_at(block, position)
            if loose is None:
                return values, (position, exc)
            value, end = loose
        values.append((value, block[position:end]))
        position = BETWEEN_VALUES.match(block, end).end()  # type: ignore[union-attr]
    return values, None


def values_all_whole(block: str, walked: list[tuple[Any, str]], unread: tuple[int, ValueError] | None) -> list[tuple[Any, str]]:
    """The values `block` holds one after another when all of it reads (`walked`, with `unread` None), or, when that
    gives fewer than two, all of it once mended (one of them wrote a regex's `\\d` or a trailing comma); else []."""
    several = walked if unread is None else []
    if len(several) < 2:
        mended, unread_mended = values_one_after_another(slips_mended(block))
        several = mended if unread_mended is None else []
    return several


def cut_off_error(block: str, walked: list[tuple[Any, str]], unread: tuple[int, ValueError] | None) -> str:
    """The JSON error of `block`'s first value that does not read (`unread`, after the values `walked`), when it and
    every value before it is an object or array (calls, not the model's words after them) and it stops inside a string
    or where a value was due (see text_ends_mid_value); else ""."""
    if unread is None or any(raw[0] not in "{[" for raw in (block[unread[0]], *(raw for _, raw in walked))):
        return ""
    exc = unread[1]
    return json_error(exc) if text_ends_mid_value(exc, block) else ""
