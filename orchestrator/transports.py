"""What every transport gives the model client: chunks, KEEPALIVE, and `TransportError` with a `kind`.

A transport (`direct_http.DirectHTTP`, `litellm_transport.LiteLLMTransport`; `transport_choice`
picks one) takes an OpenAI-style request and gives back chunks (or one whole response) with the
same attribute names, so `model.EndpointModel` reads either alike. Failures leave a transport as
`TransportError` with a `kind` the model turns into a decision (retry, watchdog, context overflow,
unreachable).
"""

from __future__ import annotations

import http.client
import re
import socket

# The kinds of TransportError.
TIMEOUT = "timeout"  # no byte for request_timeout_s
CONNECTION = "connection"  # refused, reset, dropped mid-stream
STATUS = "status"  # the server answered with an error status
CONTEXT_FULL = "context_full"  # the prompt does not fit the model's window
UNROUTABLE = "unroutable"  # no known way to this model (litellm's provider, the api_base's scheme)
WRONG_SERVER = "wrong_server"  # what answers at api_base is not a chat API: a redirect, a web page, a compressed body
TOO_LONG = "too_long"  # one event grew past what max_output_chars could need, and has not ended
GARBLED = "garbled"  # an answer or event that is not JSON: the server's fault (cut, mangled), never the model's

OPENAI_PREFIX = "openai/"
# Yielded by a stream for a keep-alive: a sign the connection lives, not that the model speaks.
KEEPALIVE = None

# llama.cpp, vLLM and Ollama word it differently; litellm maps only some to ContextWindowExceededError.
# Older llama.cpp answers 500 "context shift is disabled" when prompt and answer pass n_ctx, and vLLM's
# V1 engine 400 "... is longer than the maximum model length of 4096": retried as an outage or refused
# as a setting, the same too-long request failed the same way each time. llama.cpp's other 500s for a prompt that
# cannot fit were retried as an outage too, and the task paused: "input (N tokens) is too large to process. increase
# the physical batch size" (a prompt past the batch it must take whole) and "input (N tokens) is larger than the max
# context size (M tokens)", matched with their "input (N tokens)": a proxy's or another server's 500 saying a request
# was too large to process is a passing outage, and stays retried. Its 500 "Context size has been exceeded." is not
# one: its KV cache, shared by the requests it serves at once, is full, and every request decoded beside them gets it;
# a later attempt may fit.
CONTEXT_FULL_WORDING = re.compile(
    r"exceeds the available context size|context length|maximum context|context window|context shift is disabled"
    r"|maximum model length|input \(\d+ tokens\) is (?:too large to process|larger than the max context size)",
    re.IGNORECASE,
)
# llama.cpp names its refusal of a prompt past the window by the error's `type`, whatever the message's wording.
CONTEXT_FULL_TYPES = frozenset({"exceed_context_size_error"})


class TransportError(Exception):
    def __init__(self, kind: str, message: str, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.message = message
        # Seconds the server asked to wait before the next request (Retry-After), if it said.
        self.retry_after = retry_after


def event_byte_limit(max_output_chars: int) -> int:
    """The most bytes one stream event may take before it is runaway output: max_output_chars of
    text at its longest in JSON (12 bytes a character, as a \\uXXXX\\uXXXX pair) and room around it.

    The model's reader caps what it is given; a line that never ends is never given,
    and grew in memory without bound (gigabytes in seconds from a local server).
    """
    return 12 * max_output_chars + 65536


# llama.cpp's 500 for output its parser cannot read quotes that output, the model's own words, after it: a file
# the model was writing about context windows is no refusal of the prompt, and the failure is retried.
_ECHOED_OUTPUT = re.compile(r"(failed to parse input at pos \d+:).*", re.IGNORECASE | re.DOTALL)


def says_context_full(message: str) -> bool:
    """Whether the server's message refuses the prompt as past its window (in its own words, not ones it quotes)."""
    return CONTEXT_FULL_WORDING.search(_ECHOED_OUTPUT.sub(r"\1", message)) is not None


def names_full_window(error: object) -> bool:
    """Whether an error object's `type` names a prompt past the window, however its message is worded."""
    named = error.get("type") if isinstance(error, dict) else None
    return isinstance(named, str) and named in CONTEXT_FULL_TYPES


def kind_of(message: str) -> str:
    return CONTEXT_FULL if says_context_full(message) else STATUS


# What a broken, refused, reset or silent connection raises through http.client.
NETWORK_ERRORS = (OSError, http.client.HTTPException)


def network_error(exc: BaseException, *, connecting: bool = False) -> TransportError:
    kind = TIMEOUT if isinstance(exc, TimeoutError) and not connecting else CONNECTION
    return TransportError(kind, f"{type(exc).__name__}: {exc}".rstrip(": "))


def shut_down(sock: socket.socket | None) -> None:
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed
