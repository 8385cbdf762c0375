"""The calls in one block of JSON (a fence's body, a tag's, a line): one value, several one after another, or whole
calls then a broken one; repaired, or cut off, when it does not read."""

from __future__ import annotations

from typing import Any

from orchestrator import loose_json
from orchestrator.call_arguments import read_repaired
from orchestrator.call_shapes import WrittenCall, written_from_value
from orchestrator.cut_off_json import text_ends_mid_value
from orchestrator.strict_json import json_error, loads
from orchestrator.values_in_a_row import cut_off_error, values_all_whole, values_one_after_another


def calls_in_block(block: str, known: set[str], cut: bool) -> list[WrittenCall]:
    """The calls in one JSON block, or [] when the block is not shaped like a call. A block of several
    calls one after another (a line each, or `; ` between) is each of them: repaired as one value,
    all but the last would be lost."""
    block = block.strip()
    if not block.startswith(("{", "[")):
        return []
    try:
        value, error = loads(block), ""
    except ValueError as exc:
        walked, unread = values_one_after_another(block)
        several = values_all_whole(block, walked, unread)
        if len(several) > 1:
            written = [written_from_value(one, raw, "", known, cut) for one, raw in several]
            if all(found is not None for found in written):
                return [call for found in written for call in found or ()]
        if not cut:
            split = _whole_calls_then_the_rest(block, walked, unread, known)
            if split:
                return split
        later_cut = cut_off_error(block, walked, unread)  # a second call cut off: the block's own error is "Extra data"
        (value, repeated), error = read_repaired(block), later_cut or json_error(exc)
        ends_mid_value = text_ends_mid_value(exc, block) or bool(later_cut)
        return written_from_value(value, block, error, known, cut, ends_mid_value=ends_mid_value, repeated_key=repeated) or []
    return written_from_value(value, block, error, known, cut) or []


def _whole_calls_then_the_rest(
    block: str, walked: list[tuple[Any, str]], unread: tuple[int, ValueError] | None, known: set[str]
) -> list[WrittenCall]:
    """The whole calls `block` starts with (`walked`), then the calls in the rest, read alone as a block of its own (mended,
    repaired or cut off as a single call is), or none when the rest is words (see loose_json.only_words: the model's, or a
    fence's ``` cut short) or a value cut off before it names a tool; [] when the values walked are not all calls, or the
    rest holds none. Repaired with the calls before it, the rest would be merged with them when their keys are the same,
    and those calls lost."""
    if not walked or unread is None:
        return []
    rest_text = block[unread[0] :]
    words_after = loose_json.only_words(rest_text)
    if not words_after and not rest_text.startswith(("{", "[")):
        return []
    whole = [written_from_value(value, raw, "", known, cut=False) for value, raw in walked]
    if any(found is None for found in whole):
        return []
    calls = [call for found in whole for call in found or ()]
    if words_after:
        return calls
    rest = calls_in_block(rest_text, known, cut=False)
    if not rest and loose_json.stops_mid_value(rest_text):
        return calls  # a value cut off before it names a tool (`{'`), as a bare one is dropped
    return calls + rest if rest else []
