"""Read the JSON text a model wrote for a call's arguments (or a whole call) into a value.

Small models write JSON with slips: a regex's `\\d` as is, a trailing comma, single
quotes and bare keys, closing brackets missing, two objects run together, or an answer
that stops mid-value. Strict JSON is read first (orchestrator/strict_json.py); then the
slips are mended and a JSON5-like value is read loosely (orchestrator/mended_json.py, with
orchestrator/loose_json.py), and the repair library reads the rest, on a budget
(orchestrator/repaired_json.py). Text that stops inside a string or where a value was due
is cut off (orchestrator/cut_off_json.py), never repaired: run, it would be half of what
was meant. A reading keeps its JSON error and the key a loose reading named twice, so that
the call can be reported as broken and the model told why. JSON nested deeper than
strict_json.MAX_JSON_DEPTH is unreadable. This module knows no call's form and no tool:
orchestrator/toolcalls.py and the readers of calls written in the text
(orchestrator/written_calls.py's forms) ask it, and orchestrator/values_in_a_row.py for
values run together in one block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from orchestrator import loose_json
from orchestrator.cut_off_json import text_ends_mid_value
from orchestrator.loose_json import BETWEEN_VALUES
from orchestrator.mended_json import json5_like_value_at, read_loosely, slips_mended
from orchestrator.repaired_json import repair
from orchestrator.strict_json import json_error, loads, raw_decode

# What is wrong with a call in an answer cut at the length limit: it is never run, nor repaired.
CUT_OFF = "cut off at the length limit"


@dataclass(frozen=True)
class Arguments:
    """Arguments as read: the value, and the JSON error if it only parsed after repair, and whether that error
    says the text ends in the middle of a value (see text_ends_mid_value), and the key that the loose reading or the
    repair named twice in one object ("" for none: see loose_json.repeated_key), and whether the object closed before
    the text's end, more than words following it (see closes_early)."""

    value: Any
    raw: str
    json_error: str = ""
    ends_mid_value: bool = False
    repeated_key: str = ""
    closes_early: bool = False


def read_arguments(text: str) -> Arguments:
    """Parse arguments JSON; if it is not valid, keep the repaired value and the error. Arguments cut off mid-value
    are never run, so they are not repaired: the repair library is quadratic on some garbage (64 kB of `{'` took
    minutes), and what it would make of them is thrown away."""
    if not text.strip():
        return Arguments({}, text)
    try:
        return Arguments(loads(text), text)
    except ValueError as exc:
        if text_ends_mid_value(exc, text):
            return Arguments(None, text, json_error(exc), ends_mid_value=True)
        if closes_early(text):
            return Arguments(None, text, json_error(exc), closes_early=True)
        value, repeated = read_repaired(text)
        return Arguments(value, text, json_error(exc), repeated_key=repeated)


def closes_early(text: str) -> bool:
    """Whether `text`, a call's arguments alone, holds a first object or array that reads (as JSON, or JSON5-like with no
    quote in its strings: see mended_json.json5_like_value_at) and closes before the text's end, followed by more than the
    model's words (see loose_json.only_words), stray closing brackets, or further values (calls run together): a quote inside
    its content, not escaped, taken for a string's end, before a bracket (`"content": "s = "}"; t = 1"}`). Repaired, it ran
    with its content cut at that quote, the rest of the text dropped. A JSON5-like reading whose strings hold a quote
    (`'d = {1: 'a', 2: 'b'}'}` read as closing after `'b'`) already guessed where they end: the repair reads it whole."""
    start = len(text) - len(text.lstrip())
    try:
        _, end = raw_decode(text, start)
    except ValueError:
        read = json5_like_value_at(text, start)
        if read is None or _holds_a_quote(read[0]):
            return False
        end = read[1]
    rest = text[BETWEEN_VALUES.match(text, end).end() :]  # type: ignore[union-attr]
    return not rest.startswith(("{", "[")) and bool(rest.strip("}], \t\r\n")) and not loose_json.only_words(rest)


def _holds_a_quote(value: Any) -> bool:
    if isinstance(value, str):
        return "'" in value or '"' in value
    if isinstance(value, dict):
        return any(_holds_a_quote(key) or _holds_a_quote(item) for key, item in value.items())
    return isinstance(value, list) and any(_holds_a_quote(item) for item in value)


def read_repaired(text: str) -> tuple[Any, str]:
    """`text`'s value after repair, and the key its reading names twice (see loose_json.repeated_key; "" when mended to
    strict JSON, which keeps the last): first of the two slips small models make most (a backslash JSON does
    not know: a regex's `\\d` written as is; a comma before a closing bracket) mended exactly; then, when
    `text` is one JSON5-like object or array (single quotes, bare keys, the model's words after it, closing
    brackets missing though every value is whole), that value read loosely; the repair library only for the
    rest, since it reads an apostrophe inside a single-quoted string (`'it's done'`) as its end (and strips the
    line breaks that end a string, which repair puts back)."""
    mended = slips_mended(text)
    if mended != text:
        try:
            return loads(mended), ""
        except ValueError:
            pass
    loose = read_loosely(text)
    return (loose if loose is not None else _every_object_kept(text, repair(text))), loose_json.repeated_key(text)


def _every_object_kept(text: str, repaired: Any) -> Any:
    """`repaired`, or, when the repair library read `text` as objects one after another (calls run together, a quote in
    their content not escaped) and kept only the last, all of them in a list: at its top level the library takes an object
    with the same keys as the one before for an update of it, and drops that one (a write lost). Read as an array's items,
    none is dropped; that reading counts only when its last item is the object kept."""
    if not isinstance(repaired, dict) or not text.lstrip().startswith("{") or not _OBJECTS_MEET.search(text):
        return repaired
    items = repair("[" + text + "]")
    if isinstance(items, list) and len(items) > 1 and all(isinstance(item, dict) for item in items) and items[-1] == repaired:
        return items
    return repaired


# Where one object may close and the next open (outside strings or not: only a reason to read the text again as an array).
_OBJECTS_MEET = re.compile(r"\}\s*[;,]?\s*\{")


def decode_string_object(value: Any) -> Any:
    """Arguments sent as a JSON string that encodes an object: the one coercion allowed."""
    if value is None:
        return {}
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            decoded = loads(value)
        except ValueError:
            return value
        if isinstance(decoded, dict):
            return decoded
    return value
