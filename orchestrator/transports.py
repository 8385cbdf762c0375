"""How a chat request reaches the model server: through litellm, or straight over HTTP.

Both transports take the same OpenAI-style request and give back chunks (or one
whole response) with the same attribute names, so `model.EndpointModel` reads
either alike. Failures leave a transport as `TransportError` with a `kind` the
model turns into a decision (retry, watchdog, context overflow, unreachable).

Why two: litellm reaches every provider, but its per-call work (request
mapping, cost lookups, response rebuilding, a fresh connection per call) costs
8-10 ms of CPU a call, more than the rest of a night's work per call. The
servers overnight is for — llama-server, vLLM, Ollama's /v1, LM Studio — speak
the OpenAI chat API already, and for them kept-alive http.client connections do
the same job in about a millisecond (bench/concurrency.py). `auto` picks the
direct route for those ("openai/<name>" with an `api_base`, no proxy in the way)
and litellm for everything else.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import math
import os
import queue
import re
import socket
import threading
import time
import urllib.request
import weakref
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Iterator
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from orchestrator.config import ModelConfig

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
_CONTEXT_FULL = re.compile(r"exceeds the available context size|context length|maximum context|context window", re.IGNORECASE)


class TransportError(Exception):
    def __init__(self, kind: str, message: str, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.message = message
        # Seconds the server asked to wait before the next request (Retry-After), if it said.
        self.retry_after = retry_after


def uses_direct_http(config: ModelConfig) -> bool:
    """Whether `config` is answered over plain OpenAI-compatible HTTP rather than litellm."""
    if config.transport == "direct":
        return True
    if config.transport == "litellm":
        return False
    return bool(config.api_base) and config.name.startswith(OPENAI_PREFIX) and not _behind_proxy(config.api_base or "")


def _behind_proxy(url: str) -> bool:
    """Whether HTTP(S)_PROXY applies to `url` (and NO_PROXY does not exempt it): litellm honours those, http.client does not."""
    parts = urlsplit(url)
    return bool(urllib.request.getproxies().get(parts.scheme)) and not urllib.request.proxy_bypass(parts.hostname or "")


def routing_problem(config: ModelConfig) -> str | None:
    """Why litellm cannot route `config.name` to any provider (checked before a night, without a request); None if it can."""
    if uses_direct_http(config):
        return None
    litellm = litellm_module()
    try:
        litellm.get_llm_provider(model=config.name, api_base=config.api_base)
    except Exception as exc:  # litellm.BadRequestError: "LLM Provider NOT provided"
        return " ".join(str(exc).split())[:200]
    return None


def transport_for(config: ModelConfig, *, max_output_chars: int = 20000) -> "DirectHTTP | LiteLLMTransport":
    if uses_direct_http(config):
        return DirectHTTP(config, max_event_bytes=event_byte_limit(max_output_chars))
    return LiteLLMTransport(config)


def event_byte_limit(max_output_chars: int) -> int:
    """The most bytes one stream event may take before it is runaway output: max_output_chars of
    text at its longest in JSON (12 bytes a character, as a \\uXXXX\\uXXXX pair) and room around it.

    The model's reader caps what it is given; a line that never ends is never given,
    and grew in memory without bound (gigabytes in seconds from a local server).
    """
    return 12 * max_output_chars + 65536


def server_answer_time(api_base: str | None, timeout_s: float) -> float | None:
    """Seconds the server at `api_base` took to answer a plain `GET /` (any status); `math.inf`
    when it answered nothing within `timeout_s` or refused the connection.

    Told apart this way: a model that is silent (a long tool call the server holds back until it
    ends) and a server that is not (stopped, wedged, stalled, its HTTP threads all stuck): the
    first answers a GET from another thread at once; the second lets the kernel take the
    connection and answers late or never. Anything the server does (an error status, a reset, a
    TLS refusal) is an answer. None when it cannot be asked directly (no api_base, or a proxy
    between): nothing is known.
    """
    if not api_base or _behind_proxy(api_base):
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
    except (TimeoutError, ConnectionRefusedError):
        return math.inf
    except _NETWORK_ERRORS:  # a reset, a close without a word, a TLS refusal: something there is at work
        pass
    finally:
        connection.close()
    return time.monotonic() - started


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
    if not api_base or _behind_proxy(api_base):
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
    from orchestrator.config import MAX_CONTEXT_WINDOW

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
    except (*_NETWORK_ERRORS, ValueError):
        return None
    finally:
        connection.close()


def _kind_of(message: str) -> str:
    return CONTEXT_FULL if _CONTEXT_FULL.search(message) else STATUS


class DirectHTTP:
    """POST /chat/completions over kept-alive connections; Server-Sent Events read as they come.

    The standard library's http.client, with one idle-connection pool: the
    request is always the same shape, and measured against the scripted
    server it costs half the CPU of httpcore and a quarter of httpx (whose
    cookie, redirect and URL handling buy nothing here). The socket timeout
    bounds every blocking read, so `request_timeout_s` is a silence limit,
    not a cap on a long but living stream.
    """

    def __init__(self, config: ModelConfig, *, max_event_bytes: int = event_byte_limit(20000)) -> None:
        base = urlsplit((config.api_base or "").rstrip("/"))
        if base.scheme not in ("http", "https") or not base.hostname:
            raise TransportError(UNROUTABLE, f"api_base {config.api_base!r} is not an http:// or https:// URL")
        self._connection_class = http.client.HTTPSConnection if base.scheme == "https" else http.client.HTTPConnection
        self._host, self._port = base.hostname, base.port
        self._path = base.path + "/chat/completions"
        self._model = config.name.removeprefix(OPENAI_PREFIX)
        self._headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if config.api_key:
            self._headers["Authorization"] = f"Bearer {config.api_key}"
        self._read_timeout = config.request_timeout_s
        self._max_event_bytes = max_event_bytes
        self._connect_timeout = min(config.request_timeout_s, 10.0)
        self._idle: queue.SimpleQueue[http.client.HTTPConnection] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._every: weakref.WeakSet[http.client.HTTPConnection] = weakref.WeakSet()
        self._interrupted = False

    def send(self, request: dict[str, Any], *, stream: bool) -> Any:
        """Chunks (an iterator with `close`) when streaming, else the whole response."""
        content = _dumps({**request, "model": self._model})
        response, connection = self._post(content)
        media_type = _media_type(response.getheader("Content-Type"))
        if response.status < 400:
            problem = _not_a_chat_answer(response)
            if problem is not None:
                connection.close()
                raise TransportError(WRONG_SERVER, problem, response.status)
        # A server that does not stream answers a stream request with the whole JSON response; one
        # that labels its events wrongly (text/plain, application/x-ndjson) is known by its body.
        whole = not stream or media_type not in ("", "text/event-stream")
        if response.status >= 400 or whole:
            try:
                body = response.read()
            except _NETWORK_ERRORS as exc:
                connection.close()
                raise _network_error(exc) from exc
            self._release(connection, response)
            if response.status >= 400:
                raise _status_error(response.status, body, _retry_after(response.getheader("Retry-After")))
            answers = _answers_in_body(body, response.status, media_type)
            return _OneChunk(answers) if stream else answers[0]
        return _Events(response, lambda: self._release_streamed(connection, response), connection.close, self._max_event_bytes)

    def interrupt(self) -> None:
        """Cut every connection, now and from now on: a blocked read returns at once (from any thread)."""
        with self._lock:
            self._interrupted = True
            connections = list(self._every)
        for connection in connections:
            _shut_down(connection.sock)

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return

    def _post(self, content: bytes) -> tuple[http.client.HTTPResponse, http.client.HTTPConnection]:
        """Send on an idle connection, or a new one. A kept-alive connection that the server
        closed meanwhile is retried once on a new one, as every HTTP client does."""
        while True:
            connection, reused = self._connection()
            try:
                connection.request("POST", self._path, body=content, headers=self._headers)
                return connection.getresponse(), connection
            except _NETWORK_ERRORS as exc:
                connection.close()
                if reused and isinstance(exc, _STALE) and not self._interrupted:
                    continue
                raise _network_error(exc) from exc

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        try:
            return self._idle.get_nowait(), True
        except queue.Empty:
            pass
        connection = self._connection_class(self._host, self._port, timeout=self._connect_timeout)
        try:
            connection.connect()
        except _NETWORK_ERRORS as exc:
            raise _network_error(exc, connecting=True) from exc
        connection.sock.settimeout(self._read_timeout)
        with self._lock:
            self._every.add(connection)
            interrupted = self._interrupted
        if interrupted:  # cancelled while this connection was being made
            _shut_down(connection.sock)
        return connection, False

    def _release(self, connection: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        # Only a response read to its end leaves the connection fit for the next request.
        if response.isclosed() and not response.will_close and not self._interrupted:
            self._idle.put(connection)
        else:
            connection.close()

    def _release_streamed(self, connection: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        """After `[DONE]` (or the body's end): the connection is reused only if its body ends now."""
        if response.isclosed() or self._body_ends_now(connection, response):
            self._release(connection, response)
        else:
            connection.close()

    def _body_ends_now(self, connection: http.client.HTTPConnection, response: http.client.HTTPResponse) -> bool:
        """Whether the body's end (its last chunk, blank lines before it) comes within _BODY_END_GRACE_S.

        Usually it came with `[DONE]` and is read from the buffer; a server may send it a
        moment later. Pings or silence instead mean a body kept open: not reusable. Any
        failure here is only that: the answer already stands.
        """
        sock = connection.sock
        if sock is None:
            return False
        try:
            sock.settimeout(_BODY_END_GRACE_S)
            for _ in range(4):
                piece = response.read1(65536)
                if not piece:
                    sock.settimeout(self._read_timeout)
                    return True
                if piece.strip():
                    return False
        except _NETWORK_ERRORS:
            pass
        return False


# How long after `[DONE]` the end of the body may take to come for the connection to be reused.
_BODY_END_GRACE_S = 0.1
# What a broken, refused, reset or silent connection raises through http.client.
_NETWORK_ERRORS = (OSError, http.client.HTTPException)
# What a kept-alive connection closed by the server raises on its next request.
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


def _network_error(exc: BaseException, *, connecting: bool = False) -> TransportError:
    kind = TIMEOUT if isinstance(exc, TimeoutError) and not connecting else CONNECTION
    return TransportError(kind, f"{type(exc).__name__}: {exc}".rstrip(": "))


def _status_error(status: int, body: bytes, retry_after: float | None = None) -> TransportError:
    message = _error_message(body.decode("utf-8", "replace")) or f"HTTP {status}"
    return TransportError(_kind_of(message), message, status, retry_after)


_SECONDS = re.compile(r"[0-9]+", re.ASCII)
_STATUS = re.compile(r"[0-9]{3}", re.ASCII)


def _retry_after(value: str | None) -> float | None:
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


def _shut_down(sock: socket.socket | None) -> None:
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


def _media_type(content_type: str | None) -> str:
    """A Content-Type header's media type: "text/event-stream; charset=utf-8" is text/event-stream."""
    return (content_type or "").split(";")[0].strip().lower()


def _not_a_chat_answer(response: http.client.HTTPResponse) -> str | None:
    """Why a response that is not an error cannot be a chat completion, if it cannot.

    Read as events, each of these would be an empty answer, blamed on the model
    (empty_response) night after night, when api_base is what is wrong.
    """
    if 300 <= response.status < 400:
        where = (response.getheader("Location") or "no Location")[:200]
        # Not followed: the pool holds connections to one address, and a redirect there is a setting to fix.
        return f"redirects ({response.status} {response.reason}) to {where}: set api_base to the address it redirects to"
    encoding = (response.getheader("Content-Encoding") or "identity").strip().lower()
    if encoding != "identity":
        return (
            f"sent its answer compressed ({encoding}), which the direct transport does not decode: "
            'turn compression off in the proxy, or set [model] transport = "litellm"'
        )
    return None


_DONE_EVENT = re.compile(rb"(?:^|\n)data: ?\[DONE\]")
_EVENT_STARTS = (b"data:", b":", b"event:", b"id:", b"retry:")


def _answers_in_body(body: bytes, status: int, media_type: str) -> list[Any]:
    """A whole body's answers, known by what it holds, not by its Content-Type: server-sent events
    (some servers label them text/plain or application/x-ndjson), or one JSON response; anything
    else (a web page on the wrong port) is no chat API's answer: read as one, it was an empty
    answer blamed on the model."""
    start = body.lstrip()[:8]
    if start.startswith(_EVENT_STARTS):
        events = (line[5:].strip() for line in body.splitlines() if line.startswith(b"data:"))
        return [_answer(event) for event in events if event and event != b"[DONE]"]
    if start.startswith((b"{", b"[")) or (_is_json(media_type) and not start):
        return [_answer(body)]
    raise TransportError(
        WRONG_SERVER,
        f"answered {status} with {media_type or 'no Content-Type'}, not a chat completion: is api_base the API's address (often ending in /v1)?",
        status,
    )


def _is_json(media_type: str) -> bool:
    return media_type == "application/json" or media_type.endswith("+json")


class _OneChunk(list):
    """A whole response as a stream of one chunk (the model's reader takes a choice's message for its delta)."""

    def close(self) -> None:
        pass


class _Events:
    """The `data:` payloads of an SSE response, as attribute objects, until `[DONE]`."""

    def __init__(self, response: http.client.HTTPResponse, release: Any, discard: Any, max_event_bytes: int) -> None:
        self._response = response
        self._release = release
        self._discard = discard
        self._max_event_bytes = max_event_bytes
        self._finished = False
        # The body ended where the connection closed, with no [DONE]: nothing in it tells a whole
        # answer from one cut by a restarting server (the model asks the answer's finish_reason).
        self.ended_by_close = False

    def __iter__(self) -> Iterator[Any]:
        try:
            yield from self._events()
        except _NETWORK_ERRORS as exc:
            raise _network_error(exc) from exc

    def _events(self) -> Iterator[Any]:
        data: list[bytes] = []
        pending = b""
        while True:
            piece = self._response.read1(65536)
            if not piece:
                break
            lines = (pending + piece).split(b"\n")
            pending = lines.pop()
            told = False
            for line in lines:
                line = line.removesuffix(b"\r")
                if line.startswith(b":"):
                    # An SSE comment: a proxy's keep-alive, not the model. The reader gets KEEPALIVE,
                    # so that its watchdog still sees how long the model itself has been silent.
                    told = True
                    yield KEEPALIVE
                    continue
                payload = _take_line(line, data)
                if payload == b"[DONE]":
                    # The answer is whole: nothing after it is read, so a server that keeps the body
                    # open (pings, a stall) can neither hold the answer back nor turn it into a failure.
                    self._finished = True
                    return
                if payload is not None:
                    told = True
                    yield _answer(payload)
            if not told:
                yield self._unfinished_line(pending, data)
        self._finished = True
        self.ended_by_close = self._response.length is None and not self._response.chunked
        # A body that ends without the blank line after its last event.
        payload = _take_line(pending, data) if pending else None
        payload = payload if payload is not None else _take_line(b"", data)
        if payload is not None and payload != b"[DONE]":
            yield self._last_answer(payload)

    def _unfinished_line(self, pending: bytes, data: list[bytes]) -> Any:
        """KEEPALIVE for a read that completed no event (a trickle, one long line), so that the reader
        judges silence by the time since the last event, not the last byte; unless the event
        being read has grown past max_event_bytes."""
        if len(pending) + sum(map(len, data)) > self._max_event_bytes:
            raise TransportError(TOO_LONG, f"one event passed {self._max_event_bytes} bytes without ending")
        return KEEPALIVE

    def _last_answer(self, payload: bytes) -> Any:
        try:
            return _answer(payload)
        except TransportError as failure:
            if failure.status is None and self.ended_by_close:  # not JSON: half an event, then the close
                raise TransportError(CONNECTION, "the connection closed in the middle of an event") from None
            raise

    def close(self) -> None:
        if self._finished:
            self._release()
        else:  # cut short (runaway, cancel, an error): the rest of the body is not worth reading
            self._discard()


def _take_line(line: bytes, data: list[bytes]) -> bytes | None:
    """Add one SSE line to the event being read; at its blank line, the event's payload."""
    if line.startswith(b"data:"):
        data.append(line[5:].removeprefix(b" "))
    elif line.startswith(b"error:"):  # llama-server reports a failure mid-stream this way
        text = line[6:].decode("utf-8", "replace")
        message = _error_message(text) or text.strip()
        raise TransportError(_kind_of(message), message)
    elif not line and data:
        payload = b"\n".join(data).strip()
        data.clear()
        return payload
    return None


def _answer(payload: bytes) -> Any:
    """An event's JSON, or a whole response's; a top-level `error` in it is raised as the status error it stands for.

    Servers report a failure this way with status 200 (Ollama's "model not found", a model
    still loading); read as an answer it was empty, and blamed on the model.
    """
    answer = _loads(payload)
    error = getattr(answer, "error", None)
    # "error": null, "" or {} in a normal answer is no error (the openai SDK reads it so too).
    if vars(error) if isinstance(error, SimpleNamespace) else error:
        message = _error_message(payload.decode("utf-8", "replace")) or payload[:200].decode("utf-8", "replace")
        # Its own code when that is an HTTP error status; without one, a fault of the server's (retried).
        status = _http_status(getattr(error, "code", None)) or 500
        raise TransportError(_kind_of(message), message, status)
    return answer


def _http_status(code: Any) -> int | None:
    """`code` as an HTTP error status (503, "503"), or None for anything else ("model_not_found", 7, null)."""
    if isinstance(code, str) and _STATUS.fullmatch(code):  # not isdigit: '²' passes it, and int() refuses it
        code = int(code)
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600:
        return code
    return None


class LiteLLMTransport:
    """`litellm.completion` for any provider it knows."""

    def __init__(self, config: ModelConfig) -> None:
        self._litellm = litellm_module()
        self._settings: dict[str, Any] = {
            # litellm's own default is 6000 s; this is also the per-read silence limit.
            "timeout": config.request_timeout_s,
            # Retries live in EndpointModel.complete only; the openai SDK would nest its own.
            "num_retries": 0,
            "max_retries": 0,
        }
        if config.api_base:
            self._settings["api_base"] = config.api_base
            # The openai SDK refuses to send a request without some key.
            self._settings["api_key"] = config.api_key or "sk-none"
        elif config.api_key:
            self._settings["api_key"] = config.api_key

    def send(self, request: dict[str, Any], *, stream: bool) -> Any:
        litellm = self._litellm
        try:
            raw = litellm.completion(**request, **self._settings)
        except Exception as exc:
            raise self._translate(exc) from exc
        if not stream:
            return raw
        chunks = _provider_chunks(raw)
        whole = self._whole_answer(chunks)
        return whole if whole is not None else _LiteLLMChunks(chunks, self._translate)

    def close(self) -> None:
        pass

    def _whole_answer(self, chunks: Any) -> "_OneChunk | None":
        """An OpenAI-compatible server's answer to a stream request that is not a stream, read as DirectHTTP reads it.

        The openai SDK looks for events in whatever body comes back; in one JSON
        response (a server that does not stream, or `{"error": ...}` with status 200)
        it finds none, and the answer was empty, blamed on the model.
        """
        response = getattr(chunks, "response", None)  # the openai SDK's stream holds its httpx response
        headers = getattr(response, "headers", None)
        if headers is None:
            return None
        media_type = _media_type(headers.get("content-type"))
        if media_type in ("", "text/event-stream"):
            return None
        try:
            body = response.read()
        except Exception as exc:
            raise self._translate(exc) from exc
        return _OneChunk(_answers_in_body(body, response.status_code, media_type))

    def _translate(self, exc: Exception) -> Exception:
        import httpx
        import openai

        if isinstance(exc, TransportError):
            return exc
        wrapped = _wrapped_failure(exc, self._litellm)
        if wrapped is not None:
            return self._translate(wrapped)
        if isinstance(exc, httpx.TimeoutException):  # raised by the httpx response itself, not through the SDK
            return TransportError(TIMEOUT, f"{type(exc).__name__}: {exc}")
        if isinstance(exc, httpx.TransportError):
            return TransportError(CONNECTION, f"{type(exc).__name__}: {exc}")
        litellm = self._litellm
        status = getattr(exc, "status_code", None)
        status = status if isinstance(status, int) else None
        message = " ".join(str(exc).split()) or type(exc).__name__
        # litellm raises its Timeout (a 408) both for a read that timed out and for a 408 the server sent:
        # only the first is silence; the second carries the server's response and is retried as a status.
        if isinstance(exc, openai.APITimeoutError) and status in (None, 408) and getattr(exc, "response", None) is None:
            return TransportError(TIMEOUT, message, status)
        if isinstance(exc, litellm.exceptions.ContextWindowExceededError) or _CONTEXT_FULL.search(message):
            return TransportError(CONTEXT_FULL, message, status)
        if isinstance(exc, litellm.exceptions.LiteLLMUnknownProvider) or "LLM Provider NOT provided" in message:
            return TransportError(UNROUTABLE, message, status)
        if status is None and isinstance(exc, openai.APIError) and not isinstance(exc, openai.APIConnectionError):
            # An `error` event in the stream, as DirectHTTP reads one: its code, or a fault of the server's.
            body = exc.body if isinstance(exc.body, dict) else {}
            status = _http_status(body.get("code")) or 500
        if status is not None:
            headers = getattr(getattr(exc, "response", None), "headers", None)
            retry_after = _retry_after(headers.get("retry-after")) if headers is not None else None
            return TransportError(STATUS, message, status, retry_after)
        if isinstance(exc, openai.APIConnectionError):
            return TransportError(CONNECTION, message)
        if isinstance(exc, json.JSONDecodeError):  # the SDK reading a cut or mangled event or body
            return TransportError(GARBLED, f"the server sent something that is not JSON ({message})")
        return exc


def _wrapped_failure(exc: Exception, litellm: Any) -> Exception | None:
    """The failure a litellm MidStreamFallbackError stands for, if it names one.

    litellm wraps what goes wrong mid-stream for its own providers (ollama_chat/) in
    it, with the wrapped failure's status: a read timeout became a 408, retried and
    reported as model_unreachable, where it is the model's silence (watchdog_timeout).
    """
    if not isinstance(exc, litellm.exceptions.MidStreamFallbackError):
        return None
    inner = getattr(exc, "original_exception", None) or exc.__cause__
    return inner if isinstance(inner, Exception) and inner is not exc else None


class _LiteLLMChunks:
    def __init__(self, stream: Any, translate: Any) -> None:
        self._stream = stream
        self._translate = translate
        self._saw_done = False
        self._watch_for_done(getattr(stream, "response", None))

    def _watch_for_done(self, response: Any) -> None:
        """Note whether the body held `data: [DONE]`, which the openai SDK reads and does not show:
        a body that ended with it was whole, even without a finish_reason."""
        if response is None or not callable(getattr(response, "iter_bytes", None)):
            return
        read = response.iter_bytes
        tail = b""

        def iter_bytes(*args: Any, **kwargs: Any) -> Iterator[bytes]:
            nonlocal tail
            for piece in read(*args, **kwargs):
                tail = (tail + piece)[-64:]
                self._saw_done = self._saw_done or _DONE_EVENT.search(tail) is not None
                yield piece

        response.iter_bytes = iter_bytes  # before the SDK's stream first reads (it reads on first use)

    def __iter__(self) -> Iterator[Any]:
        try:
            yield from self._stream
        except Exception as exc:
            raise self._translate(exc) from exc

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if callable(close):
            close()

    @property
    def ended_by_close(self) -> bool:
        """Whether the body had no length, was not chunked and held no [DONE]: its end was the
        connection's close, which says nothing of whether the answer was whole."""
        headers = getattr(getattr(self._stream, "response", None), "headers", None)
        if headers is None or self._saw_done:
            return False
        return "content-length" not in headers and "chunked" not in headers.get("transfer-encoding", "").lower()

    def bytes_read(self) -> int:
        """Bytes of the body read so far (0 when the stream does not say: litellm's own providers)."""
        count = getattr(getattr(self._stream, "response", None), "num_bytes_downloaded", 0)
        return count if isinstance(count, int) else 0

    def cut(self) -> bool:
        """Shut the socket under the stream from another thread, so a read blocked on it returns at once.

        Only the openai SDK's stream (every OpenAI-compatible server) shows its httpx
        response, and httpcore the socket; False for litellm's own providers' streams.
        """
        response = getattr(self._stream, "response", None)
        network = getattr(response, "extensions", {}).get("network_stream")
        sock = network.get_extra_info("socket") if network is not None else None
        if sock is None:
            return False
        _shut_down(sock)
        return True


def _provider_chunks(wrapper: Any) -> Any:
    """The OpenAI-compatible chunk stream litellm holds, when it holds one; else litellm's own wrapper.

    litellm's CustomStreamWrapper rebuilds and prices the whole response at the
    end of every stream (10 ms or more of CPU a call). For OpenAI-compatible
    servers the openai SDK stream it wraps carries the same chunks, usage
    included, over the same HTTP response. Other providers keep litellm's translation.
    """
    inner = getattr(wrapper, "completion_stream", None)
    if inner is not None and type(inner).__module__.partition(".")[0] == "openai" and hasattr(inner, "__iter__"):
        return inner
    return wrapper


def litellm_module() -> Any:
    """Import litellm on first use: it takes seconds and must not fetch a price list."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    # No "Give Feedback / Get Help" banners on errors: a cron job's output is a report.
    litellm.suppress_debug_info = True
    litellm.set_verbose = False
    # Per-chunk success logging runs an event loop in a worker thread for every
    # chunk (a few ms CPU a call); overnight registers no litellm callbacks, so it
    # would log to nobody.
    litellm.disable_streaming_logging = True
    # Its cost estimate counts the prompt with tiktoken on every call (~2 ms CPU);
    # overnight takes token counts from the server, or estimates them itself.
    litellm.disable_token_counter = True
    return litellm


def _dumps(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _loads(data: str | bytes) -> Any:
    """JSON with objects as attribute namespaces, read the way the openai SDK's objects are."""
    if isinstance(data, bytes):
        # A server that cuts a character's bytes in two sends invalid UTF-8: that character is lost, not the answer.
        data = data.decode("utf-8", errors="replace")
    try:
        return json.loads(data, object_hook=lambda fields: SimpleNamespace(**fields))
    except ValueError as exc:
        raise TransportError(GARBLED, f"the server sent something that is not JSON: {str(data)[:120]!r}") from exc


def _error_message(text: str) -> str:
    """The message of an OpenAI-style error body, or the body itself, on one line."""
    try:
        body = json.loads(text)
    except ValueError:
        return " ".join(text.split())[:500]
    error = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(error, dict):
        error = error.get("message") or error
    return " ".join(str(error).split())[:500]
