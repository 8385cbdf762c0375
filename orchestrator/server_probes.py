"""The model server asked directly, beside the chat: whether it answers at all, and the context window it serves."""

from __future__ import annotations

import errno
import http.client
import json
import math
import re
import socket
import time
from typing import Any
from urllib.parse import urlsplit

from orchestrator.transport_choice import behind_proxy
from orchestrator.transports import NETWORK_ERRORS


def server_answer_time(api_base: str | None, timeout_s: float) -> float | None:
    """Seconds the server at `api_base` took to answer a plain `GET /` (any status); `math.inf`
    when it answered nothing within `timeout_s`, refused the connection, or could not be reached
    (its name resolves no more, no route to its host or network).

    Told apart this way: a model that is silent (a long tool call the server holds back until it
    ends) and a server that is not (stopped, wedged, stalled, its HTTP threads all stuck): the
    first answers a GET from another thread at once; the second lets the kernel take the
    connection and answers late or never. Anything the server does (an error status, a reset, a
    TLS refusal) is an answer. None when it cannot be asked directly (no api_base, or a proxy
    between): nothing is known.
    """
    if not api_base or behind_proxy(api_base):
        return None
    base = urlsplit(api_base)
    if base.scheme not in ("http", "https") or not base.hostname:
        return None
    if base.scheme == "https":
        import ssl

        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # alive is all that is asked
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(base.hostname, base.port, timeout=timeout_s, context=context)
    else:
        connection = http.client.HTTPConnection(base.hostname, base.port, timeout=timeout_s)
    started = time.monotonic()
    try:
        connection.request("GET", "/", headers={"Connection": "close"})
        connection.getresponse().close()
    except (TimeoutError, ConnectionRefusedError, socket.gaierror):
        return math.inf
    except NETWORK_ERRORS as exc:  # a reset, a close without a word, a TLS refusal: something there is at work
        if getattr(exc, "errno", None) in _NO_ROUTE:  # unless nothing there was reached: how long that took says nothing of it
            return math.inf
    finally:
        connection.close()
    return time.monotonic() - started


# What connecting raises when the way to the server is gone (a machine switched off, a VPN down).
_NO_ROUTE = (errno.EHOSTUNREACH, errno.ENETUNREACH)

# litellm providers that are Ollama's own API (not its OpenAI-compatible /v1).
_OLLAMA_PREFIXES = ("ollama/", "ollama_chat/")


def served_context_window(api_base: str | None, name: str, api_key: str | None, timeout_s: float) -> tuple[int, str] | None:
    """The context window the server at `api_base` says it runs model `name` with, and which of its
    answers said so; None when it says nothing usable (or cannot be asked directly: no api_base, a proxy).

    A local server's model is rarely one litellm knows, and the window it serves is the server's
    setting, not the model's: llama.cpp's `GET /props` (n_ctx, per slot), vLLM's `GET /v1/models`
    (max_model_len), Ollama's `POST /api/show` (num_ctx, when the model's parameters set it: its own
    default depends on the Ollama version and the machine, so nothing is guessed).
    """
    if not api_base or behind_proxy(api_base):
        return None
    base = urlsplit(api_base)
    if base.scheme not in ("http", "https") or not base.hostname:
        return None
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    model = name.split("/", 1)[1] if "/" in name else name
    root = base.path.rstrip("/").removesuffix("/v1")
    if name.startswith(_OLLAMA_PREFIXES):
        shown = _asked(base, "POST", f"{root}/api/show", headers, {"model": model}, timeout_s)
        parameters = shown.get("parameters") if isinstance(shown, dict) else None
        found = re.search(r"^num_ctx\s+(\d+)\s*$", parameters, re.MULTILINE) if isinstance(parameters, str) else None
        window = _usable_window(_whole_number(found.group(1))) if found else None
        return (window, "Ollama's /api/show (num_ctx)") if window else None
    props = _asked(base, "GET", f"{root}/props", headers, None, timeout_s)
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    n_ctx = _usable_window(settings.get("n_ctx") if isinstance(settings, dict) else None)
    if n_ctx:
        return n_ctx, "llama.cpp's /props (n_ctx)"
    listed = _asked(base, "GET", f"{base.path.rstrip('/')}/models", headers, None, timeout_s)
    entries = [entry for entry in (listed.get("data") if isinstance(listed, dict) else None) or () if isinstance(entry, dict)]
    named = [entry for entry in entries if entry.get("id") == model] or (entries if len(entries) == 1 else [])
    length = _usable_window(named[0].get("max_model_len") if named else None)
    if length:
        return length, "vLLM's /v1/models (max_model_len)"
    return None


def _usable_window(value: Any) -> int | None:
    """A window a server reported, if it is one the config could hold: a whole number from 1 to
    MAX_CONTEXT_WINDOW. A broken or hostile server's 10**400 overflowed the float arithmetic that shares the
    window out, mid-night; a negative, fractional, boolean or quoted one is no window either (None: not reported)."""
    from orchestrator.model_section import MAX_CONTEXT_WINDOW

    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_CONTEXT_WINDOW:
        return value
    return None


def _whole_number(digits: str) -> int | None:
    """`digits` as a number; None past what any window could be (Python refuses to read 4300 digits and more)."""
    return int(digits) if len(digits) <= _WINDOW_DIGITS else None


# Digits enough for MAX_CONTEXT_WINDOW, and a few leading zeros.
_WINDOW_DIGITS = 16


def _asked(base: Any, method: str, path: str, headers: dict[str, str], body: Any, timeout_s: float) -> Any:
    """The JSON a 200 answer to one request carries; None for anything else (an error status, no server, not JSON)."""
    connection_type = http.client.HTTPSConnection if base.scheme == "https" else http.client.HTTPConnection
    connection = connection_type(base.hostname, base.port, timeout=timeout_s)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        sent = {**headers, "Connection": "close", **({"Content-Type": "application/json"} if payload else {})}
        connection.request(method, path or "/", body=payload, headers=sent)
        response = connection.getresponse()
        data = response.read(1_000_000)
        return json.loads(data) if response.status == 200 else None
    except (*NETWORK_ERRORS, ValueError):
        return None
    finally:
        connection.close()
