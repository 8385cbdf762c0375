"""Text holding half of a UTF-16 surrogate pair, made writable.

A lone surrogate ("\\ud83d") is a str that no UTF-8 file or database can take:
the transcript, the run store, notes.md, the report and the log would each fail
on it. It reaches us through JSON (an escape that a small model writes into
code it is asked to produce, or a pair that a server split across two stream
chunks) and from the file system (a file name that is not UTF-8). It is mended
where such text comes in: the model client, the parsing of tool-call arguments,
the tools' output. A pair that meets again is joined into its character; a lone
half becomes the six characters of its escape, which is most often what the
model meant to write. The transcript, notes.md and the run store's events mend
or escape whatever might still slip through. A file name that the tools showed
with such escapes is turned back (`unmend_name`) when a tool is given it.
"""

from __future__ import annotations

import re
from typing import Any, Callable

# The escape mend writes for a byte of a file name that is not UTF-8 (Python's surrogateescape: U+DC80-U+DCFF).
_ESCAPED_NAME_BYTE = re.compile(r"\\u(dc[89a-f][0-9a-f])", re.IGNORECASE)


def mend(text: str) -> str:
    """`text`, with surrogate pairs joined and lone surrogates written as their backslash escape."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    joined = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    return joined.encode("utf-8", "backslashreplace").decode("utf-8")


def mend_all(value: Any) -> Any:
    """Parsed JSON `value`, with every string in it (keys too) mended."""
    return strings_mapped(value, mend)


def strings_mapped(value: Any, change: Callable[[str], str]) -> Any:
    """`value` as JSON holds it (dicts, lists, strings, numbers; a message's tuples read as lists) with every string in
    it, keys too, through `change`: a new value, `value` itself unchanged. Here for mend_all; the night's records use it
    with the redaction too (what the model wrote, recorded with secret values as ***, while its tools get it whole)."""
    # Recursion: a call's arguments nest at most strict_json.MAX_JSON_DEPTH levels, a message a few.
    if isinstance(value, str):
        return change(value)
    if isinstance(value, (list, tuple)):
        return [strings_mapped(item, change) for item in value]
    if isinstance(value, dict):
        return {strings_mapped(key, change): strings_mapped(item, change) for key, item in value.items()}
    return value


def unmend_name(name: str) -> str:
    """A file name as the tools showed it, back as the file system gave it: the reverse of `mend`
    for the bytes of a name that are not UTF-8, so that a model can open a file it was shown."""
    if "\\u" not in name:
        return name
    return _ESCAPED_NAME_BYTE.sub(lambda escape: chr(int(escape.group(1), 16)), name)
