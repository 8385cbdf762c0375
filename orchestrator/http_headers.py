"""What a response's headers say: its media type, and how long it asks to wait (Retry-After)."""

from __future__ import annotations

import email.utils
import re
from datetime import datetime, timezone


def media_type_of(content_type: str | None) -> str:
    """A Content-Type header's media type: "text/event-stream; charset=utf-8" is text/event-stream."""
    return (content_type or "").split(";")[0].strip().lower()


_SECONDS = re.compile(r"[0-9]+", re.ASCII)


def retry_after_seconds(value: str | None) -> float | None:
    """A Retry-After header's wait in seconds: a number of seconds, or an HTTP date; None for anything else."""
    if not value:
        return None
    value = value.strip()
    if _SECONDS.fullmatch(value):  # not str.isdigit: '²' is a digit to it, and no number to float()
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
        if when.tzinfo is None:
            return None
        return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())
    except (TypeError, ValueError, OverflowError):  # a zone offset past any clock's, a date past year 9999
        return None
