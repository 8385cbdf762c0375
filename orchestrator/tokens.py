"""Rough token counts, for servers (and scripted models) that report no usage.

About four characters a token: good enough for budgets and the report, and
free, where a real tokenizer would cost milliseconds a call.
"""

from __future__ import annotations

from typing import Any, Iterable


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
