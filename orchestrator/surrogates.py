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
or escape whatever might still slip through.
"""

from __future__ import annotations

from typing import Any


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
    if isinstance(value, str):
        return mend(value)
    if isinstance(value, list):
        return [mend_all(item) for item in value]
    if isinstance(value, dict):
        return {mend(key) if isinstance(key, str) else key: mend_all(item) for key, item in value.items()}
    return value
