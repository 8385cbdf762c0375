"""A prompt the server cut without a word: Ollama's /v1 drops a prompt's front past its num_ctx and answers as if
it had read it whole, so the model works from half a conversation and nothing fails.

Only the server's own count of the prompt can tell, and only against a known window: a prompt that fits the window
is never cut, and a count far below what was sent is no sign by itself, as Ollama (0.1.x, and 0.30 until it was fixed)
and others count only the part of the prompt they had not cached, a few hundred tokens of a conversation of
thousands from its second request on. So a cut is claimed where the text sent is past the window at the fewest tokens
any tokenizer could make of it, and the server counted a prompt within the window. Our usual estimate (four
characters a token) runs high for prose (four to five a token) and far high for runs of one character (indentation,
===== rulers, which a BPE packs many to a token): it would claim cuts of prompts that fit. It is a warning, never a
failure.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

# Tokens between the server's count and the fewest the text sent can take that say nothing: small prompts.
MIN_TOKENS_MISSING = 1024
# More characters a token than any tokenizer packs ordinary text (prose runs four to five, code three to four).
MOST_CHARS_PER_TOKEN = 6
_ONE_CHARACTER_RUN = re.compile(r"(.)\1{3,}", re.DOTALL)


def _texts(messages: Iterable[Any]) -> Iterable[str]:
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        yield str(content or "")


def fewest_prompt_tokens_bound(messages: Iterable[Any]) -> int:
    """`fewest_prompt_tokens` or more, without its pattern: the check on every answer, which most answers stop at."""
    return sum(len(text) for text in _texts(messages)) // MOST_CHARS_PER_TOKEN


def fewest_prompt_tokens(messages: Iterable[Any]) -> int:
    """The fewest tokens the messages' text can take: a run of one character as one, six characters a token
    (message text only, as `tokens.estimate_prompt_tokens` reads it: tool schemas and calls would only add)."""
    return sum(len(_ONE_CHARACTER_RUN.sub(r"\1", text)) for text in _texts(messages)) // MOST_CHARS_PER_TOKEN


def prompt_cut_evidence(counted: int, fewest: int, window: int | None) -> str | None:
    """Why the server seems to have read less of the prompt than was sent (`counted`: its prompt_tokens, 0 where
    it sent none; `fewest`: the fewest tokens the prompt sent can take; `window`: the known context window), or None."""
    if not counted or not window or fewest - counted < MIN_TOKENS_MISSING:
        return None
    if counted <= window < fewest:
        return (f"the server counted {counted} prompt tokens, within the {window}-token context window, of a prompt "
                f"of at least {fewest}")
    return None
