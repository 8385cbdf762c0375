"""The direct transport: POST /chat/completions over kept-alive http.client connections, for OpenAI-compatible servers."""

from __future__ import annotations

import http.client
import json
import queue
import threading
import weakref
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from orchestrator.answer_bodies import OneChunk, answers_in_body, read_error_body
from orchestrator.http_headers import media_type_of, retry_after_seconds
from orchestrator.sse_events import Events
from orchestrator.transports import (
    NETWORK_ERRORS, OPENAI_PREFIX, UNROUTABLE, WRONG_SERVER, TransportError, event_byte_limit, network_error, shut_down,
)

if TYPE_CHECKING:
    from orchestrator.config import ModelConfig


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
        media_type = media_type_of(response.getheader("Content-Type"))
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
            except NETWORK_ERRORS as exc:
                connection.close()
                raise network_error(exc) from exc
            self._release(connection, response)
            if response.status >= 400:
                raise _status_error(response.status, body, retry_after_seconds(response.getheader("Retry-After")))
            answers = answers_in_body(body, response.status, media_type)
            return OneChunk(answers) if stream else answers[0]
        return Events(response, lambda: self._release_streamed(connection, response), connection.close, self._max_event_bytes)

    def interrupt(self) -> None:
        """Cut every connection, now and from now on: a blocked read returns at once (from any thread)."""
        with self._lock:
            self._interrupted = True
            connections = list(self._every)
        for connection in connections:
            shut_down(connection.sock)

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
            except NETWORK_ERRORS as exc:
                connection.close()
                if reused and isinstance(exc, _STALE) and not self._interrupted:
                    continue
                raise network_error(exc) from exc

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        try:
            return self._idle.get_nowait(), True
        except queue.Empty:
            pass
        connection = self._connection_class(self._host, self._port, timeout=self._connect_timeout)
        try:
            connection.connect()
        except NETWORK_ERRORS as exc:
            raise network_error(exc, connecting=True) from exc
        connection.sock.settimeout(self._read_timeout)
        with self._lock:
            self._every.add(connection)
            interrupted = self._interrupted
        if interrupted:  # cancelled while this connection was being made
            shut_down(connection.sock)
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
        except NETWORK_ERRORS:
            pass
        return False


# How long after `[DONE]` the end of the body may take to come for the connection to be reused.
_BODY_END_GRACE_S = 0.1
# What a kept-alive connection closed by the server raises on its next request.
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


def _status_error(status: int, body: bytes, retry_after: float | None = None) -> TransportError:
    said = read_error_body(body.decode("utf-8", "replace"), fallback=f"HTTP {status}")
    return TransportError(said.kind, said.message, status, retry_after)


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


def _dumps(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
