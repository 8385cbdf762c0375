"""Which values the redaction replaces (`redactable`: long enough, and no plain word) and what it writes for them
(`REDACTED`)."""

from __future__ import annotations

# Shorter values are not replaced: "1", "true" or a port would mangle every output they appear in.
MIN_REDACTED_CHARS = 8
REDACTED = "***"


def redactable(value: str) -> bool:
    """Long enough, and no plain word (below), to be replaced by the Redactor."""
    value = value.strip()
    return len(value) >= MIN_REDACTED_CHARS and not _plain_word(value)


def _plain_word(value: str) -> bool:
    """Letters of one case only, shorter than a generated secret."""
    return len(value) < 16 and value.isalpha() and (value.islower() or value.isupper())
