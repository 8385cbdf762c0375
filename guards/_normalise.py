"""Call identity with the noise a small model adds taken out.

Small models re-issue the same call with cosmetic differences: `./a.py` for
`a.py`, a doubled space in a command, a trailing blank. Exact comparison lets
such loops run on; these helpers compare what the call means instead.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from orchestrator.records import ToolCall

# Argument names whose value is a path: `./a.py`, `a.py` and `.//a.py` are one file.
_PATH_KEYS = frozenset({"path", "file", "filename", "dir", "directory", "folder"})


def call_key(call: ToolCall) -> str:
    """Name plus noise-free arguments, in one stable form."""
    # Several guards ask about the same call in a row; keep the last answer (calls are frozen).
    global _last
    if _last[0] is call:
        return _last[1]
    arguments = {key: _value(key, value) for key, value in call.arguments.items()}
    key = f"{call.name} {json.dumps(arguments, sort_keys=True, ensure_ascii=False)}"
    _last = (call, key)
    return key


_last: tuple[ToolCall | None, str] = (None, "")


def _value(key: str, value: Any) -> Any:
    # Multi-line text (file content, edits) is left exact: there, whitespace is meaning.
    if not isinstance(value, str) or "\n" in value:
        return value
    squeezed = " ".join(value.split())
    if key in _PATH_KEYS and squeezed:
        return posixpath.normpath(squeezed)
    return squeezed
