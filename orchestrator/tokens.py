"""Rough token counts, for servers (and scripted models) that report no usage.

About four characters a token: good enough for budgets and the report, and
free, where a real tokenizer would cost milliseconds a call.
"""

from __future__ import annotations

from typing import Any, Iterable


# Room in a context window is counted at 3 characters a token: code and tool output run denser than
# the prose the estimate above is for, so a share counted this way still fits.
WINDOW_CHARS_PER_TOKEN = 3


def window_chars(context_window: int, share: float) -> int:
    """`share` of a context window of `context_window` tokens, in characters."""
    return int(context_window * share * WINDOW_CHARS_PER_TOKEN)


def estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4) if text else 0


def estimate_prompt_tokens(messages: Iterable[Any]) -> int:
    """The messages' text content, plain strings or OpenAI content parts."""
    total = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        total += estimate_tokens(str(content or ""))
    return total
