"""Text a person reads, from sources nobody controls: the model, a check's output.

Control characters in it can redraw a terminal line (a failed task shown as
succeeded), hide what follows or break a line in two; written as their escapes
they are harmless and still tell what was there.
"""

from __future__ import annotations

import re

# C0 and C1 controls, DEL, the line and paragraph separators, and bidi overrides and isolates.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def visible(text: str, keep: str = "") -> str:
    """`text` with each control character not in `keep` written as its escape (`\\r`, `\\x1b`, `\\u202e`)."""
    return _CONTROL.sub(lambda found: found.group() if found.group() in keep else repr(found.group())[1:-1], text)


def visible_document(text: str) -> str:
    """A text of many lines (notes.md, its entries) as printed for a person: its line breaks and tabs kept, every
    other control character shown as its escape, never obeyed by the terminal."""
    return visible(text, keep="\n\t")


def shortened(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, the last one `…` when cut (nothing at all for a limit of 0)."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"[:limit]
