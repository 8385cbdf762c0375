"""Whether JSON that did not read stops inside a string or where a value was due: cut off, so never repaired.

Its slips are mended first (orchestrator/mended_json.py), as the repair would; JSON5-like quoting is judged by
orchestrator/loose_json.py.
"""

from __future__ import annotations

import json

from orchestrator import loose_json
from orchestrator.mended_json import slips_mended
from orchestrator.strict_json import loads


def text_ends_mid_value(exc: ValueError, text: str) -> bool:
    """Whether `text`, whose JSON failed with `exc`, stops inside a string or where a value was due: cut off, though not at
    the length limit (a server's own cap, a model that stopped). Repaired, its last value would be half of
    what was meant, or one the repair made up (`"new": ` read as `""`, an edit that deletes), and run as such.
    One that lacks only its closing brackets, every value whole, is a slip the repair may mend."""
    if not isinstance(exc, json.JSONDecodeError):
        return False
    if _stops_mid_value(exc, text):
        return True
    # The error may be a slip the repair mends first (a regex's `\d`, a trailing comma), before where the text stops.
    mended = slips_mended(text)
    if mended != text:
        try:
            loads(mended)
        except json.JSONDecodeError as after_mending:
            if _stops_mid_value(after_mending, mended):
                return True
        except ValueError:
            return False
        else:
            return False  # whole once mended: a slip only
    # Or its quoting, in JSON5-like text, or the objects after the first (JSON's own error is "Extra data" then).
    return loose_json.stops_mid_value(text)


def _stops_mid_value(exc: json.JSONDecodeError, text: str) -> bool:
    if exc.msg.startswith("Unterminated string"):
        return True
    rest = text[exc.pos :].rstrip()
    if exc.msg.startswith("Invalid \\uXXXX escape"):
        return len(rest) < 6 and '"' not in rest  # `\u12`: the text ends inside the escape, so inside its string
    if exc.msg == "Expecting value":
        # Nothing where a value was due, or the start of a literal or a number's sign (`tru`, `-`) and nothing after.
        return not rest or rest == "-" or any(word.startswith(rest) for word in ("true", "false", "null"))
    return exc.msg == "Expecting ':' delimiter" and not rest
