"""What a transport's failure means for the night: another attempt, the model's struggle, or a setting to fix.

Both transports raise `transports.TransportError` with a kind; the night needs a decision. A busy
or broken endpoint is worth another attempt (`Retryable`, for the retries); silence, runaway
output and a full context window are the model's (`QualityError`, noted for the next iteration);
a refused configuration is `ModelUnreachable`, which no retry can change. A server's error may
quote the request (the URL with api_base's token, the Authorization header), and its message goes
into logs, the run store, the exit's error line and notes.md: it is redacted here, before any of
them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from orchestrator import transports
from orchestrator.errors import ModelUnreachable, QualityError
from orchestrator.records import ModelResponse
from orchestrator.runaway import runaway_output
from orchestrator.url_secrets import shown_url
from orchestrator.watchdog import watchdog_timeout

if TYPE_CHECKING:  # pydantic is not needed to import this module
    from orchestrator.config import ModelConfig
    from orchestrator.response_draft import Draft

# Statuses that mean "the endpoint is busy or broken right now": try again.
_RETRY_STATUSES = frozenset({408, 409, 425, 429}) | frozenset(range(500, 600))
# Statuses that mean "the configuration is wrong": retrying cannot help.
_CONFIG_STATUSES = frozenset({401, 402, 403, 404, 407})

# Tokens short of the window that still count as reaching it (or a hundredth of a larger window): a
# server stops one token early, and a window known from the config may differ from the server's by a few.
WINDOW_END_SLACK = 16

CONTEXT_OVERFLOW_CORRECTION = (
    "The conversation grew past the model's context window. Read less at once (search, or read one file), "
    "make one small change, run the check and submit in fewer turns."
)


class Retryable(Exception):
    """An attempt failed in a way another attempt may not."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


def decision_for(failure: transports.TransportError, config: ModelConfig, redact: Callable[[str], str]) -> Exception:
    """What a transport failure means for the night."""
    message = redact(failure.message)
    reason = message[:200]  # cut after the redaction: a cut secret would leave its part
    status = failure.status
    if failure.kind == transports.TIMEOUT:
        return watchdog_timeout(config.request_timeout_s)
    if failure.kind == transports.TOO_LONG:
        return runaway_output(reason)
    if failure.kind == transports.CONTEXT_FULL:
        return QualityError("context_overflow", CONTEXT_OVERFLOW_CORRECTION, evidence=reason, message="context window exceeded")
    if failure.kind == transports.UNROUTABLE:
        return ModelUnreachable(f"cannot route model {config.name!r}: {reason}")
    if failure.kind == transports.WRONG_SERVER:  # a setting to fix: no retry can help
        return ModelUnreachable(f"model endpoint {endpoint_shown(config)} {message}")
    if failure.kind in (transports.CONNECTION, transports.GARBLED) or status in _RETRY_STATUSES:
        return Retryable(reason, failure.retry_after)
    if status in _CONFIG_STATUSES:
        return ModelUnreachable(f"model endpoint {endpoint_shown(config)} refused the request ({status}): {reason}")
    return RuntimeError(f"model request rejected ({status}): {reason}")


def cut_by_full_window(response: ModelResponse, counted: Draft, asked_tokens: int, window: int | None) -> QualityError | None:
    """context_overflow for an answer the server stopped at the window's end, not at `max_tokens`.

    llama.cpp (its context shift off, the default) ends an answer whose prompt and answer reach n_ctx
    with finish_reason "length", as it ends one at max_tokens. Taken as the model's, the cut call or
    text was blamed on it (broken_tool_call, empty_response saying to raise max_tokens), and the next,
    longer request failed the same way. An answer shorter than asked is not enough to tell: llama.cpp
    started with `-n` caps every request's max_tokens at it, vLLM at the model's generation_config,
    a proxy at the provider's output limit, each ending the answer with "length" early. So the claim
    needs the window known and the server's own counts (`counted`: 0 where it sent none, and
    estimates claim nothing) of prompt and answer ending at it.
    """
    if response.finish_reason != "length" or not window or not 0 < counted.completion_tokens < asked_tokens:
        return None
    filled = counted.prompt_tokens + counted.completion_tokens
    if not counted.prompt_tokens or abs(filled - window) > max(WINDOW_END_SLACK, window // 100):
        # Short of it the window had room; well past it, the server's is larger than the one known.
        return None
    evidence = (
        f"the server ended the answer after {counted.completion_tokens} of the {asked_tokens} tokens asked "
        f"(finish_reason=length) with {counted.prompt_tokens} tokens of prompt: {filled} of the {window}-token "
        "context window"
    )
    return QualityError("context_overflow", CONTEXT_OVERFLOW_CORRECTION, evidence=evidence, message="context window full")


def endpoint_shown(config: ModelConfig) -> str:
    """The endpoint as an error names it: api_base without its secrets, and the model."""
    return f"{shown_url(config.api_base)} ({config.name})" if config.api_base else config.name
