"""An OpenAI-compatible chat server on 127.0.0.1 that replays a `Reply` script.

Real litellm talks to it over HTTP, so tests and the struggle benchmark exercise
the same request, streaming, retry and watchdog code a night does. It speaks
just enough of the chat-completions API for that: streamed (SSE) and plain
answers, native tool calls, usage figures, error statuses, stalls, slow
streams and endless output. It is never the product running.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable, Iterator

from orchestrator.scripted import Reply
from orchestrator.tokens import estimate_prompt_tokens, estimate_tokens

# An endless reply stops here even if the client never hangs up.
ENDLESS_CAP_CHARS = 5_000_000
# A non-streamed endless reply is one finite (but far too long) message.
ENDLESS_PLAIN_CHARS = 200_000
_CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


class ClientGone(Exception):
    """The client hung up (or the server is stopping); stop writing."""


class ScriptedServer:
    """Serves `replies` in order, one per chat request; records each request body.

    When the script runs out it answers an empty assistant message and counts
    it in `exhausted`, so an under-scripted test fails on content, not a hang.
    """

    def __init__(
        self,
        replies: Iterable[Reply] = (),
        port: int = 0,
        responder: Callable[[dict[str, Any]], Reply | None] | None = None,
    ) -> None:
        self._replies: deque[Reply] = deque(replies)
        # Answers from the request itself, for conversations run in parallel (benchmarks).
        self._responder = responder
        self._lock = threading.Lock()
        self._port = port
        self._stopping = threading.Event()
        self._open_sockets: set[socket.socket] = set()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.requests: list[dict[str, Any]] = []
        # The HTTP headers of each chat request, beside `requests`.
        self.headers: list[dict[str, str]] = []
        # When each chat request arrived (time.monotonic()), beside `requests`: shows which calls overlapped.
        self.arrivals: list[float] = []
        self.connections_opened = 0
        # When (time.time(), to set beside a log's timestamps) each chat answer was cut because its client hung up
        # before its end: a cancelled stream the client closed, not one read to its end.
        self.hang_ups: list[float] = []
        self.exhausted = 0
        # What the server says of itself: llama.cpp's `GET /props` (404 while None), fields a vLLM adds to
        # its `GET /v1/models` entry (`max_model_len`), Ollama's `POST /api/show` (404 while None).
        self.props: dict[str, Any] | None = None
        self.model_fields: dict[str, Any] = {}
        self.show: dict[str, Any] | None = None
        # The path of every request that is not a chat request, in order.
        self.other_requests: list[str] = []

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> "ScriptedServer":
        httpd = _QuietServer(("127.0.0.1", self._port), _handler_for(self))
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, wake sleeping handlers and cut open connections."""
        if self._httpd is None:
            return
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self.drop_connections()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._httpd = None

    def drop_connections(self) -> None:
        """Close every open connection, as a server does when a kept-alive connection idles too long."""
        with self._lock:
            sockets = list(self._open_sockets)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> "ScriptedServer":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def open_connections(self) -> int:
        """Connections the server holds open now (a client's kept-alive ones included)."""
        with self._lock:
            return len(self._open_sockets)

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("server not started")
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- script --------------------------------------------------------------

    def enqueue(self, *replies: Reply) -> None:
        with self._lock:
            self._replies.extend(replies)

    def _take(self, body: dict[str, Any], headers: dict[str, str], arrived: float) -> Reply | None:
        if self._responder is not None:
            return self._responder(body)
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            self.arrivals.append(arrived)
            if self._replies:
                return self._replies.popleft()
            self.exhausted += 1
            return None

    def _track(self, sock: socket.socket, open_: bool) -> None:
        with self._lock:
            if open_:
                self._open_sockets.add(sock)
                self.connections_opened += 1
            else:
                self._open_sockets.discard(sock)

    def _pause(self, seconds: float) -> None:
        """Sleep, but wake at once when the server stops."""
        if seconds > 0 and self._stopping.wait(seconds):
            raise ClientGone("server stopping")


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client hanging up (the watchdog, a runaway cut) is routine here.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


def _handler_for(server: ScriptedServer) -> type[BaseHTTPRequestHandler]:
    class Handler(_ChatHandler):
        scripted = server

    return Handler


class _ChatHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # As llama-server, vLLM (uvicorn) and Ollama (Go) do: each SSE event leaves at once,
    # not held back by Nagle's algorithm until the client's delayed ACK.
    disable_nagle_algorithm = True
    # An idle keep-alive connection frees its thread after this long.
    timeout = 30
    scripted: ScriptedServer

    def setup(self) -> None:
        super().setup()
        self.scripted._track(self.connection, True)

    def finish(self) -> None:
        self.scripted._track(self.connection, False)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # tests read .requests; access logs would only be noise

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self.scripted.other_requests.append(self.path)
        if self.path == "/health":
            self._send_json(200, {"status": "ok"})
        elif self.path in ("/v1/models", "/models"):
            entry = {"id": "scripted", "object": "model", "owned_by": "overnight", **self.scripted.model_fields}
            self._send_json(200, {"object": "list", "data": [entry]})
        elif self.path == "/props" and self.scripted.props is not None:
            self._send_json(200, self.scripted.props)
        else:
            self._send_json(404, _error_body(404, f"no route {self.path}"))

    def parse_request(self) -> bool:
        # The request line has just been read: the request has arrived, its headers are our work.
        self._arrived = time.monotonic()
        return super().parse_request()

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        body = self._read_body()
        if self.path not in _CHAT_PATHS:
            self.scripted.other_requests.append(self.path)
            if self.path == "/api/show" and self.scripted.show is not None:
                self._send_json(200, self.scripted.show)
            else:
                self._send_json(404, _error_body(404, f"no route {self.path}"))
            return
        if body is None:
            self._send_json(400, _error_body(400, "body is not JSON"))
            return
        reply = self.scripted._take(body, dict(self.headers), self._arrived)
        try:
            self._answer(body, reply or Reply(text="", finish_reason="stop"))
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.scripted.hang_ups.append(time.time())
            self.close_connection = True
        except (ClientGone, TimeoutError):
            self.close_connection = True
        except OSError:
            self.close_connection = True

    def _read_body(self) -> dict[str, Any] | None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    def _answer(self, body: dict[str, Any], reply: Reply) -> None:
        streamed = bool(body.get("stream")) and reply.status == 200
        # A finite stream is rendered before the delay, so the delay is all the client waits:
        # the server's own work does not pile up behind it when many requests end at once.
        frames = None if not streamed or reply.endless else list(self._frames(body, reply))
        # Counted from the request's arrival, so the server's own work is inside the delay, not added to it.
        self.scripted._pause(reply.delay_s - (time.monotonic() - self._arrived))
        if reply.status != 200:
            error = _error_body(reply.status, reply.text or f"scripted error {reply.status}", reply.error_type)
            error["error"].update(reply.error_fields)
            self._send_json(reply.status, error)
            return
        if streamed:
            self._stream(reply, frames if frames is not None else self._frames(body, reply))
        else:
            self.scripted._pause(reply.stall_s)
            self._send_json(200, _completion(body, reply))

    # -- streaming -----------------------------------------------------------

    def _stream(self, reply: Reply, frames: Iterable[tuple[bytes, bool]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if not reply.endless and not reply.stall_s and not reply.chunk_interval_s:
            # Nothing paces this stream: every event and the end leave in one write, as a fast
            # server's would, instead of a packet (and a wake-up of the client) each.
            events = b"".join(frame for frame, _ in frames)
            self.wfile.write(f"{len(events):x}\r\n".encode() + events + b"\r\n0\r\n\r\n")
            return
        for index, (frame, is_delta) in enumerate(frames):
            self._write_chunk(frame)
            if is_delta:
                self.scripted._pause(reply.stall_s if index == 0 else reply.chunk_interval_s)
        self._write_chunk(b"")

    def _frames(self, body: dict[str, Any], reply: Reply) -> Iterator[tuple[bytes, bool]]:
        """The SSE events of a streamed reply, encoded, each with whether it is a delta (paced)."""
        model = str(body.get("model") or "scripted")
        created = int(time.time())
        sent: list[str] = []
        for delta in _deltas(reply, sent):
            yield _sse(_chunk(model, created, delta, None)), True
        finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
        yield _sse(_chunk(model, created, {}, finish)), False
        usage_chunk = _chunk(model, created, {}, None)
        usage_chunk["choices"] = []
        usage_chunk["usage"] = _usage(body, reply, "".join(sent))
        yield _sse(usage_chunk), False
        yield b"data: [DONE]\n\n", False

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _send_json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()


def _deltas(reply: Reply, sent: list[str]) -> Iterator[dict[str, Any]]:
    """Every delta of a streamed reply, in order; appends what was written to `sent`."""
    size = max(1, reply.chunk_chars)
    yield {"role": "assistant", "content": ""}
    for piece in _pieces(reply.reasoning, size):
        yield {"reasoning_content": piece}
    for piece in _pieces(reply.text, size):
        sent.append(piece)
        yield {"content": piece}
    for index, tool_call in enumerate(reply.tool_calls):
        sent.append(tool_call.name)
        head = {"index": index, "id": tool_call.id or f"call_{index}", "type": "function"}
        yield {"tool_calls": [{**head, "function": {"name": tool_call.name, "arguments": ""}}]}
        for piece in _pieces(tool_call.arguments, size):
            sent.append(piece)
            yield {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
    if reply.endless:
        written = 0
        while written < ENDLESS_CAP_CHARS:
            for piece in _pieces(reply.endless, size):
                written += len(piece)
                sent.append(piece)
                yield {"content": piece}


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _pieces(text: str, size: int) -> Iterator[str]:
    for start in range(0, len(text), size):
        yield text[start : start + size]


def _chunk(model: str, created: int, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _completion(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    text = reply.text
    if reply.endless:
        text += reply.endless * (ENDLESS_PLAIN_CHARS // max(1, len(reply.endless)))
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c.id or f"call_{i}", "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for i, c in enumerate(reply.tool_calls)
        ]
    written = text + "".join(c.name + c.arguments for c in reply.tool_calls)
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": str(body.get("model") or "scripted"),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop"),
            }
        ],
        "usage": _usage(body, reply, written),
    }


def _usage(body: dict[str, Any], reply: Reply, written: str) -> dict[str, int]:
    prompt = reply.prompt_tokens or estimate_prompt_tokens(body.get("messages") or [])
    completion = reply.completion_tokens or estimate_tokens(written)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _error_body(status: int, message: str, kind: str = "") -> dict[str, Any]:
    kind = kind or _ERROR_TYPES.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": str(status)}}
