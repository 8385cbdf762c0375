"""EndpointModel against servers that misbehave at the HTTP level, through real sockets and real litellm.

Each server here is a few lines on a raw socket, so a test can send exactly the bytes a broken
proxy, a web page on the wrong port or a server restarting mid-answer sends.
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from typing import Any

import pytest

from orchestrator.config import ModelConfig
from orchestrator.errors import ModelUnreachable, QualityError
from orchestrator.fake_server import ScriptedServer
from orchestrator.litellm_transport import LiteLLMTransport, litellm_module
from orchestrator.model import EndpointModel
from orchestrator.scripted import say
from tests.conftest import Handler, RawServer

MESSAGES = [{"role": "user", "content": "Fix the failing test, please."}]

def make_model(url: str, transport: str = "direct", **options: Any) -> tuple[EndpointModel, list[tuple[int, str]]]:
    config = ModelConfig(
        name=options.pop("name", "openai/x"),
        api_base=url,
        request_timeout_s=options.pop("request_timeout_s", 5.0),
        retries=options.pop("retries", 0),
        retry_backoff_s=0.0,
        transport=transport,
    )
    retries: list[tuple[int, str]] = []
    model = EndpointModel(config, sleep=lambda s: None, on_retry=lambda n, why: retries.append((n, why)), **options)
    return model, retries


def sse(*payloads: dict[str, Any] | str) -> bytes:
    return b"".join(b"data: " + (p if isinstance(p, str) else json.dumps(p)).encode() + b"\n\n" for p in payloads)


def delta(**fields: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


FINISH = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
GOOD_STREAM = sse(delta(content="Hello"), delta(content=" world"), FINISH, "[DONE]")


def response_head(status: str = "200 OK", content_type: str = "text/event-stream", extra: str = "", length: int | None = None) -> bytes:
    framing = f"Content-Length: {length}\r\n" if length is not None else ""
    return f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n{framing}{extra}Connection: close\r\n\r\n".encode()


class TestNotAChatAPI:
    """What answers at api_base is not an OpenAI-compatible chat API: a configuration problem, said so at once."""

    @pytest.mark.parametrize(
        ("answer", "named"),
        [
            (response_head("307 Temporary Redirect", "text/html", "Location: http://127.0.0.1:9/v1/chat/completions\r\n", 0), "307"),
            (response_head("308 Permanent Redirect", "text/html", "Location: /real/v1/chat/completions\r\n", 0), "308"),
            (response_head("200 OK", "text/html", length=43) + b"<html><body>Welcome to nginx!</body></html>", "text/html"),
            (response_head("200 OK", "text/event-stream", "Content-Encoding: gzip\r\n", len(gzip.compress(GOOD_STREAM)))
             + gzip.compress(GOOD_STREAM), "gzip"),
        ],
        ids=["redirect-elsewhere", "redirect-to-self", "web-page", "gzip"],
    )
    def test_direct_refuses_what_is_not_a_chat_answer(self, raw_server, answer, named):
        """A redirect, a web page or a compressed body is ModelUnreachable naming api_base and what came back,
        not retried; it used to be read as an empty answer and blamed on the model (empty_response)."""
        server = raw_server(lambda client, head: client.sendall(answer))
        model, retries = make_model(server.url, retries=3)
        with pytest.raises(ModelUnreachable) as caught:
            model.complete(MESSAGES, [])
        assert server.url in str(caught.value) and named in str(caught.value)
        assert retries == [] and server.requests == 1


    @pytest.mark.parametrize("content_type", ["text/plain", "application/x-ndjson", "application/json"])
    @pytest.mark.parametrize("via", ["direct", "litellm"])
    def test_events_labelled_as_something_else_are_read_as_events(self, raw_server, content_type, via):
        """Some servers send their event stream as text/plain or application/x-ndjson (even application/json):
        the body says what it is. Refusing them by their label left every task unreachable."""
        server = raw_server(lambda client, head: client.sendall(response_head(content_type=content_type) + GOOD_STREAM))
        model, retries = make_model(server.url, via)
        assert model.complete(MESSAGES, []).text == "Hello world" and retries == []


@pytest.fixture(params=["direct", "litellm"])
def transport(request) -> str:
    return request.param


def first_then_good(first: bytes) -> Handler:
    """A handler answering `first` to the first request and a good stream after."""
    answered = []

    def handler(client: socket.socket, head: bytes) -> None:
        answered.append(head)
        client.sendall(first if len(answered) == 1 else response_head() + GOOD_STREAM)

    return handler


def json_answer(body: dict[str, Any], status: str = "200 OK") -> bytes:
    data = json.dumps(body).encode()
    return response_head(status, "application/json", length=len(data)) + data


class TestErrorsInA200:
    @pytest.mark.parametrize("empty", [None, "", {}], ids=["null", "empty-text", "empty-object"])
    def test_an_empty_error_field_in_a_normal_answer_is_no_error(self, raw_server, transport, empty):
        """`"error": null`, `""` or `{}` beside a normal answer: the answer, as the openai SDK reads it (direct retried it)."""
        server = raw_server(lambda client, head: client.sendall(
            response_head() + sse({**delta(content="Hello"), "error": empty}, FINISH, "[DONE]")))
        model, retries = make_model(server.url, transport)
        assert model.complete(MESSAGES, []).text == "Hello" and retries == []

    @pytest.mark.parametrize(
        "body",
        [
            {"error": {"message": "model 'x' is loading, try again", "code": 503}},
            {"error": {"message": "model 'x' is loading, try again", "code": "503"}},
            {"error": "model 'x' is loading, try again"},
            # Digits to str.isdigit, but no number to int(): the call raised ValueError.
            {"error": {"message": "model 'x' is loading, try again", "code": "\u00b2"}},
            {"error": {"message": "model 'x' is loading, try again", "code": "5" * 5000}},
        ],
        ids=["code", "code-as-text", "no-code", "superscript-code", "endless-code"],
    )
    def test_an_error_body_with_status_200_is_a_server_fault(self, raw_server, transport, body):
        """`{"error": ...}` sent with status 200 is the status error it stands for (its code, else a server
        fault), so it is retried; it used to be an empty answer, blamed on the model as empty_response."""
        server = raw_server(first_then_good(json_answer(body)))
        model, retries = make_model(server.url, transport, retries=1)
        assert model.complete(MESSAGES, []).text == "Hello world"
        assert len(retries) == 1 and "is loading" in retries[0][1]

    def test_an_error_code_that_means_a_bad_request_is_not_retried(self, raw_server, transport):
        """A 200 carrying an error with code 400 is a rejected request, as a 400 status is."""
        server = raw_server(first_then_good(json_answer({"error": {"message": "bad tool schema", "code": 400}})))
        model, retries = make_model(server.url, transport, retries=1)
        with pytest.raises(RuntimeError, match="bad tool schema"):
            model.complete(MESSAGES, [])
        assert retries == []

    def test_an_error_event_in_the_stream_is_a_server_fault(self, raw_server, transport):
        """An `error` event after some text is retried alike, through both transports."""
        broken = response_head() + sse(delta(content="Hel"), {"error": {"message": "upstream crashed", "code": 500}}, "[DONE]")
        server = raw_server(first_then_good(broken))
        model, retries = make_model(server.url, transport, retries=1)
        assert model.complete(MESSAGES, []).text == "Hello world"
        assert len(retries) == 1 and "upstream crashed" in retries[0][1]


class TestAnErrorBodyIsReadOnce:
    """An error body's message and its kind come from one parse of it: a huge body (a proxy's page, a server's
    dump) was parsed twice, once for each. Counted with a spy on the standard library's json.loads (no module
    of ours is replaced): the body's text reaching it is the parse that matters."""

    def parses_of(self, monkeypatch, body: str) -> list[str]:
        parsed: list[str] = []
        real_loads = json.loads

        def counting_loads(text, *args, **kwargs):
            if text == body:
                parsed.append(text)
            return real_loads(text, *args, **kwargs)

        monkeypatch.setattr(json, "loads", counting_loads)
        return parsed

    @pytest.mark.parametrize("where", ["status-400", "error-line"])
    def test_a_full_window_named_by_its_type_is_read_from_one_parse(self, raw_server, monkeypatch, where):
        """An error body naming a full window only by its `type` (a 400, or llama-server's `error:` line mid-stream)
        is context_overflow with its message as evidence: both read from one parse of the body."""
        body = json.dumps({"error": {"message": "prompt of 5000 tokens does not fit in 4096", "type": "exceed_context_size_error"}})
        if where == "status-400":
            answer, parsed_text = response_head("400 Bad Request", "application/json", length=len(body)) + body.encode(), body
        else:
            answer, parsed_text = response_head() + sse(delta(content="Hel")) + b"error: " + body.encode() + b"\n\n", " " + body
        server = raw_server(lambda client, head: client.sendall(answer))
        parsed = self.parses_of(monkeypatch, parsed_text)
        with pytest.raises(QualityError) as stop:
            make_model(server.url)[0].complete(MESSAGES, [])
        assert stop.value.reason == "context_overflow" and "does not fit in 4096" in stop.value.evidence
        assert len(parsed) == 1


class TestWholeAnswerToAStreamRequest:
    def test_a_server_that_does_not_stream_is_read_whole_by_both_transports(self, raw_server, transport):
        """Asked for a stream, a server answering one JSON response is read as one chunk through litellm too
        (the openai SDK found no events in it: an empty answer, blamed on the model)."""
        whole = {
            "id": "x", "object": "chat.completion", "created": 1, "model": "x",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": "reading", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}]}}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
        }
        server = raw_server(lambda client, head: client.sendall(json_answer(whole)))
        response = make_model(server.url, transport)[0].complete(MESSAGES, [])
        assert response.text == "reading" and response.finish_reason == "tool_calls"
        assert [(c.name, c.arguments, c.id) for c in response.tool_calls] == [("read_file", '{"path": "a.py"}', "c1")]
        assert (response.prompt_tokens, response.completion_tokens) == (11, 5)


class TestSilence:
    @pytest.mark.parametrize(
        "filler",
        [b": keep-alive\n\n", sse(delta())],
        ids=["keep-alive-comments", "empty-deltas"],
    )
    def test_what_adds_nothing_to_the_answer_is_silence_through_both_transports(self, raw_server, transport, filler):
        """A proxy sending `: keep-alive` for ever, or a server in a loop sending `{"delta": {}}`, while the
        model says nothing, is cut at request_timeout_s, through litellm too: there the comments reset the
        socket's read timeout and were never seen, and each empty delta reset the silence, so the night
        waited as long as they kept coming."""
        server: RawServer

        def talk_without_saying_anything(client: socket.socket, head: bytes) -> None:
            client.sendall(response_head() + sse(delta(content="thinking")))
            for _ in range(100):
                client.sendall(filler)
                server.pause(0.1)

        server = raw_server(talk_without_saying_anything)
        model, retries = make_model(server.url, transport, request_timeout_s=1.0)
        litellm_module()  # its import takes seconds; not what is timed here
        started = time.monotonic()
        with pytest.raises(QualityError) as caught:
            model.complete(MESSAGES, [])
        assert caught.value.reason == "watchdog_timeout" and time.monotonic() - started < 1.0 + 1.5
        assert caught.value.tokens > 0  # "thinking" was written before the silence, and counts
        assert retries == []

    def test_silence_mid_answer_from_ollamas_own_api_is_the_models(self, raw_server):
        """Under litellm's ollama_chat/ route, silence after the first line is watchdog_timeout, not retried:
        litellm wraps the read timeout in MidStreamFallbackError with status 408, which was retried and
        reported as model_unreachable (no blame, task paused) for a model that had simply gone quiet."""
        server: RawServer

        def first_line_then_silence(client: socket.socket, head: bytes) -> None:
            if not head.startswith(b"POST /api/chat"):  # litellm may ask /api/show about the model
                client.sendall(json_answer({}, "404 Not Found"))
                return
            line = json.dumps({"model": "q", "message": {"role": "assistant", "content": "Hello"}, "done": False}).encode() + b"\n"
            client.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
                           + b"%x\r\n%s\r\n" % (len(line), line))
            server.pause(10)

        server = raw_server(first_line_then_silence)
        model, retries = make_model(server.base, "litellm", name="ollama_chat/q", request_timeout_s=1.0, retries=2)
        litellm_module()
        started = time.monotonic()
        with pytest.raises(QualityError) as caught:
            model.complete(MESSAGES, [])
        assert caught.value.reason == "watchdog_timeout" and time.monotonic() - started < 1.0 + 1.5
        assert retries == []


class TestWedgedServer:
    """Silence is the model's only while its server answers anything else."""

    def test_a_server_that_takes_connections_and_answers_nothing_is_an_outage(self, transport):
        with socket.socket() as wedged:  # the kernel accepts into the backlog; no process ever reads
            wedged.bind(("127.0.0.1", 0))
            wedged.listen(16)
            model, retries = make_model(f"http://127.0.0.1:{wedged.getsockname()[1]}/v1", transport, retries=1, request_timeout_s=0.5)
            with pytest.raises(ModelUnreachable, match="failed 2 times; last error: no output for 0.5 s, and the server answered no GET / in 0.5 s"):
                model.complete(MESSAGES, [])
        assert len(retries) == 1

    def test_a_server_gone_while_its_request_is_silent_is_an_outage(self, transport):
        """A server stopped with the request open (its listening socket closed, the accepted connection left
        silent) refuses the probe: the silence is the server's, retried, then model_unreachable, not watchdog_timeout."""
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
        held: list[socket.socket] = []

        def take_the_request_then_stop() -> None:
            client, _ = listener.accept()
            held.append(client)
            listener.close()  # from now on a connection is refused

        threading.Thread(target=take_the_request_then_stop, daemon=True).start()
        model, retries = make_model(url, transport, retries=0, request_timeout_s=0.5)
        try:
            with pytest.raises(ModelUnreachable, match="no output for 0.5 s, and the server answered no GET / in 0.5 s"):
                model.complete(MESSAGES, [])
        finally:
            for client in held:
                client.close()
        assert held and retries == []

    def test_a_server_whose_name_stops_resolving_while_its_request_is_silent_is_an_outage(self, raw_server, transport, monkeypatch):
        """A server whose name no longer resolves with the request open (its container removed, a VPN's DNS gone): the probe's
        failed lookup is no answer, so the silence is the server's, model_unreachable, not watchdog_timeout blamed on the model."""
        resolve = socket.getaddrinfo

        def unknown_localhost(host: Any, *rest: Any, **options: Any) -> Any:
            if host == "localhost":
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return resolve(host, *rest, **options)

        def take_the_request_then_be_forgotten(client: socket.socket, head: bytes) -> None:
            monkeypatch.setattr(socket, "getaddrinfo", unknown_localhost)
            server.pause(5)

        server = raw_server(take_the_request_then_be_forgotten)
        model, retries = make_model(server.url.replace("127.0.0.1", "localhost"), transport, retries=0, request_timeout_s=0.5)
        with pytest.raises(ModelUnreachable, match="no output for 0.5 s, and the server answered no GET / in 0.5 s"):
            model.complete(MESSAGES, [])
        assert server.requests == 1 and retries == []

    def test_a_silent_answer_from_a_server_that_still_answers_is_the_models(self, raw_server, transport):
        """The same silence from a live server (a long call it holds back, say): watchdog_timeout, not retried."""
        server = raw_server(lambda client, head: (client.sendall(response_head() + sse(delta(content="Let me"))), server.pause(5)))
        model, retries = make_model(server.url, transport, retries=1, request_timeout_s=0.5)
        with pytest.raises(QualityError) as stopped:
            model.complete(MESSAGES, [])
        assert stopped.value.reason == "watchdog_timeout" and retries == []


class TestProbeOfASilentServer:
    """What the GET beside a silent request may conclude, through a server that takes both connections."""

    @staticmethod
    def silent_then(on_probe: Any) -> Any:
        """A handler: the chat request gets nothing, ever; the probe's connection gets `on_probe`."""
        def handler(client: socket.socket, head: bytes) -> None:
            if head.startswith(b"POST"):
                time.sleep(6)
            else:
                on_probe(client)
        return handler

    def test_a_probe_the_server_resets_shows_it_alive(self, transport):
        """A server that drops the GET without a word (nginx's 444) is at work: the silence is the model's."""
        def reset(client: socket.socket) -> None:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            client.close()

        server = _GetAware(self.silent_then(reset))
        try:
            model, retries = make_model(server.url, transport, retries=1, request_timeout_s=0.5)
            with pytest.raises(QualityError) as stopped:
                model.complete(MESSAGES, [])
            assert stopped.value.reason == "watchdog_timeout" and retries == []
        finally:
            server.close()

    def test_a_server_that_answers_the_probe_only_late_was_stalled(self, transport):
        """A server stopped a little longer than request_timeout_s answers the probe once it resumes:
        it was taken for alive, and the silence blamed on the model in every task waiting on it (found
        by a review). An answer slower than 2 s shows the server stalled: retried, then model_unreachable."""
        server = _GetAware(self.silent_then(lambda client: (time.sleep(2.5), client.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"))))
        try:
            model, retries = make_model(server.url, transport, retries=0, request_timeout_s=4)
            with pytest.raises(ModelUnreachable, match=r"took 2\.[5-9] s to answer a GET / \(stalled or overloaded\)"):
                model.complete(MESSAGES, [])
        finally:
            server.close()

    def test_a_cancel_during_the_probe_is_a_cancel(self):
        """SIGTERM while the probe waits: the iteration ends cancelled, not blamed on the model nor the server."""
        from orchestrator.cancel import CancelToken
        from orchestrator.errors import Cancelled

        token = CancelToken()
        server = _GetAware(self.silent_then(lambda client: (token.cancel("SIGTERM"), time.sleep(2))))
        try:
            model, _ = make_model(server.url, "direct", retries=0, request_timeout_s=0.5, cancel=token)
            with pytest.raises(Cancelled):
                model.complete(MESSAGES, [])
        finally:
            server.close()

    def test_an_answer_gone_silent_that_a_cancel_during_the_probe_ends_counts_the_tokens_it_wrote(self, transport):
        """An answer wrote 3,000 characters and went silent; SIGTERM came while the probe asked the server: the
        Cancelled counted 0, where the same answer cut off by silence alone counts what it wrote (reference.md)."""
        from orchestrator.cancel import CancelToken
        from orchestrator.errors import Cancelled

        token = CancelToken()
        written = sse(*(delta(content=f"word{n} ") for n in range(400)))

        def handler(client: socket.socket, head: bytes) -> None:
            if head.startswith(b"POST"):
                client.sendall(response_head() + written)
                time.sleep(6)
            else:  # the probe, answered at once as a live server does, the signal come meanwhile
                token.cancel("SIGTERM")
                client.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")

        server = _GetAware(handler)
        try:
            model, _ = make_model(server.url, transport, retries=0, request_timeout_s=0.5, cancel=token)
            with pytest.raises(Cancelled) as stopped:
                model.complete(MESSAGES, [])
            assert stopped.value.tokens > 500, stopped.value.tokens
        finally:
            server.close()


class _GetAware(RawServer):
    """A RawServer whose handler sees GETs too (the base class answers them itself, as a live server does)."""

    def _answer(self, client: socket.socket) -> None:
        from tests.conftest import _read_request

        with client:
            head = _read_request(client)
            if head is not None:
                try:
                    self.handler(client, head)
                except OSError:
                    pass


class _CutReturningLate:
    """litellm's real transport, whose stream's `cut` returns only once the reading thread has seen the
    stream end: the order a loaded machine gives now and then (the reader wakes before the watcher goes on)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def send(self, request: dict[str, Any], *, stream: bool) -> Any:
        return _StreamCutLate(self._inner.send(request, stream=stream))

    def close(self) -> None:
        self._inner.close()


class _StreamCutLate:
    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._ended = threading.Event()

    def __iter__(self) -> Any:
        yield from self._inner
        self._ended.set()

    def cut(self) -> bool:
        cut = self._inner.cut()
        self._ended.wait(5)
        time.sleep(0.3)  # the reader, woken, has judged how its stream ended
        return cut

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_an_answer_a_cancel_cuts_while_the_server_pauses_counts_the_tokens_it_wrote(raw_server, transport):
    """SIGTERM while an answer of 3,000 characters paused (the reader blocked on its socket): under litellm the
    watcher cut the stream and raised the cancel at once, with 0 tokens, before the reader could count them."""
    from orchestrator.cancel import CancelToken
    from orchestrator.errors import Cancelled

    token = CancelToken()
    written = sse(*(delta(content=f"word{n} ") for n in range(400)))
    server = raw_server(lambda client, head: (client.sendall(response_head() + written), server.pause(0.5), token.cancel("SIGTERM"), server.pause(5)))
    model, _ = make_model(server.url, transport, retries=0, request_timeout_s=10, cancel=token)
    with pytest.raises(Cancelled) as stopped:
        model.complete(MESSAGES, [])
    assert stopped.value.tokens > 500, stopped.value.tokens


def test_a_reader_woken_by_the_watchers_cut_before_the_verdict_is_set_still_raises_it(raw_server):
    """Under litellm the watcher cuts a silent stream; the reader, woken, used to find no verdict yet when it
    ran first, and reported a connection closed mid-answer: model_unreachable, the task paused (seen under load)."""
    server: RawServer

    def keep_alive(client: socket.socket, head: bytes) -> None:  # the read timeout never fires: the watcher cuts
        client.sendall(response_head() + sse(delta(content="thinking")))
        for _ in range(100):
            client.sendall(b": keep-alive\n\n")
            server.pause(0.1)

    server = raw_server(keep_alive)
    model, retries = make_model(server.url, "litellm", request_timeout_s=1.0)
    model._transport = _CutReturningLate(LiteLLMTransport(model.config))
    with pytest.raises(QualityError) as caught:
        model.complete(MESSAGES, [])
    assert caught.value.reason == "watchdog_timeout" and retries == []


def chunked_head() -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def http_chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


class TestAfterDone:
    @pytest.mark.parametrize("then", ["pings", "stall"])
    def test_the_answer_ends_at_done_whatever_the_server_does_after(self, raw_server, then):
        """A server (or proxy) that keeps the body open after [DONE], pinging or silent, gets the answer
        back at once: the direct transport read on to the body's end, so pings held the answer until the
        server hung up (then a retried IncompleteRead) and a stall became watchdog_timeout."""
        server: RawServer

        def keep_open(client: socket.socket, head: bytes) -> None:
            client.sendall(chunked_head() + http_chunk(GOOD_STREAM))
            for _ in range(50):
                if then == "pings":
                    client.sendall(http_chunk(b": ping\n\n"))
                server.pause(0.1)

        server = raw_server(keep_open)
        model, retries = make_model(server.url, request_timeout_s=1.0)
        started = time.monotonic()
        assert model.complete(MESSAGES, []).text == "Hello world"
        assert time.monotonic() - started < 0.8 and retries == []

    def test_a_body_that_ends_just_after_done_keeps_its_connection(self):
        """A paced stream whose last chunk comes in a write of its own after [DONE] still leaves its
        connection for the next call."""
        with ScriptedServer([say("one", chunk_interval_s=0.01), say("two", chunk_interval_s=0.01)]) as server:
            model, _ = make_model(server.url)
            assert [model.complete(MESSAGES, []).text for _ in range(2)] == ["one", "two"]
            model.close()
            assert server.connections_opened == 1


class TestBentTypes:
    @pytest.mark.parametrize(
        ("arguments", "expected"),
        [({"path": "a.py"}, '{"path": "a.py"}'), ({"edits": [{"line": 1}]}, '{"edits": [{"line": 1}]}'), ([1, 2], "[1, 2]")],
        ids=["object", "nested", "array"],
    )
    def test_arguments_sent_as_json_itself_are_read_as_its_text(self, raw_server, transport, arguments, expected):
        """Tool arguments a server streams as a JSON object instead of its text are that JSON through litellm
        too, where they came out as a Python repr ({'path': 'a.py'}) and failed as broken_tool_call."""
        call = {"index": 0, "id": "a", "type": "function", "function": {"name": "read_file", "arguments": arguments}}
        finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
        body = response_head() + sse(delta(tool_calls=[call]), finish, "[DONE]")
        server = raw_server(lambda client, head: client.sendall(body))
        response = make_model(server.url, transport)[0].complete(MESSAGES, [])
        assert [(c.name, c.arguments) for c in response.tool_calls] == [("read_file", expected)]


class TestGarbledAnswers:
    """An event or a whole answer that is not JSON is the server's fault (a proxy cutting it, a crash
    mid-write): retried, and once retries are spent the task pauses (model_unreachable). It was a
    RuntimeError "model request rejected (None)" through direct and a raw JSONDecodeError through
    litellm: an iteration_error, notes blaming the model, the task parked (found by a review)."""

    GARBLED = [
        response_head() + sse(delta(content="Hel")) + b'data: {"choices": [{"index": 0, "delta": {"content": "lo\n\n',
        response_head("200 OK", "application/json", length=30) + b'{"choices": [{"index": 0, "mes',
    ]

    @pytest.mark.parametrize("garbled", GARBLED, ids=["cut-event", "cut-whole-answer"])
    def test_an_answer_that_is_not_json_is_retried(self, raw_server, transport, garbled):
        server = raw_server(first_then_good(garbled))
        model, retries = make_model(server.url, transport, retries=1)
        assert model.complete(MESSAGES, []).text == "Hello world"
        assert len(retries) == 1 and "not JSON" in retries[0][1]

    @pytest.mark.parametrize("garbled", GARBLED, ids=["cut-event", "cut-whole-answer"])
    def test_answers_that_stay_garbled_pause_the_task(self, raw_server, transport, garbled):
        server = raw_server(lambda client, head: client.sendall(garbled))
        model, retries = make_model(server.url, transport, retries=2)
        with pytest.raises(ModelUnreachable, match="failed 3 times; last error: the server sent something that is not JSON"):
            model.complete(MESSAGES, [])
        assert len(retries) == 2


class TestConnectionClosedMidAnswer:
    """A body framed only by the connection's close (no length, not chunked) that ends mid-answer."""

    CALL_BEGUN = sse(delta(content="I will now call"), delta(tool_calls=[
        {"index": 0, "id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"pa'}}]))

    @pytest.mark.parametrize(
        "cut",
        [CALL_BEGUN, CALL_BEGUN + b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"argum'],
        ids=["between-events", "mid-event"],
    )
    def test_a_close_before_the_answer_ended_is_a_retried_connection_failure(self, raw_server, transport, cut):
        """With neither [DONE] nor a finish_reason, a close is a server restarting mid-answer: retried as a
        connection failure. It was a truncated call ('{"pa', blamed on the model) or, cut mid-event, a
        RuntimeError (an iteration_error)."""
        server = raw_server(first_then_good(response_head() + cut))
        model, retries = make_model(server.url, transport, retries=1)
        assert model.complete(MESSAGES, []).text == "Hello world"
        assert len(retries) == 1 and "closed" in retries[0][1]

    def test_a_server_that_hangs_up_on_each_new_connection_is_retried_and_counted(self, raw_server, transport):
        """A fresh connection closed without a word (a server restarting) is a failed attempt, counted and
        waited out, then model_unreachable; only a kept-alive connection gone stale is replaced at once, uncounted."""
        hung_up: list[bytes] = []

        def hang_up_then_answer(client: socket.socket, head: bytes) -> None:
            if len(hung_up) < 10:
                hung_up.append(head)  # closed without an answer
                return
            client.sendall(response_head() + GOOD_STREAM)

        server = raw_server(hang_up_then_answer)
        model, retries = make_model(server.url, transport, retries=1)
        with pytest.raises(ModelUnreachable, match="failed 2 times"):
            model.complete(MESSAGES, [])
        assert len(retries) == 1 and len(hung_up) == 2

    def test_a_close_after_the_finish_reason_ends_the_answer(self, raw_server, transport):
        """A server that sends no [DONE] but a finish_reason, then closes, gave a whole answer."""
        body = response_head() + sse(delta(content="no done marker"), FINISH)
        server = raw_server(lambda client, head: client.sendall(body))
        model, retries = make_model(server.url, transport, retries=1)
        assert model.complete(MESSAGES, []).text == "no done marker" and retries == []

    def test_a_close_after_done_ends_the_answer_without_a_finish_reason(self, raw_server, transport):
        """A server that sends [DONE] but no finish_reason, then closes, gave a whole answer too (litellm's
        stream hides the [DONE]: the body is watched for it)."""
        body = response_head() + sse(delta(content="done, no reason"), "[DONE]")
        server = raw_server(lambda client, head: client.sendall(body))
        model, retries = make_model(server.url, transport, retries=1)
        assert model.complete(MESSAGES, []).text == "done, no reason" and retries == []


class TestRunawayAndSilenceInsideAnEvent:
    @pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
    def test_endless_reasoning_is_runaway_output(self, raw_server, transport, field):
        """A model thinking on and on in varied text is cut at max_output_chars like one writing on and on;
        reasoning was never counted (a megabyte of it was accepted as an answer)."""
        steps = [delta(**{field: f"Step {i}: maybe the bug is in module_{i * 7919 % 1000}, line {i * 31}. "}) for i in range(400)]
        body = response_head() + sse(*steps, FINISH, "[DONE]")
        server = raw_server(lambda client, head: client.sendall(body))
        with pytest.raises(QualityError) as caught:
            make_model(server.url, transport, max_output_chars=2000)[0].complete(MESSAGES, [])
        assert caught.value.reason == "runaway_output" and "2000" in caught.value.evidence
        assert caught.value.tokens > 400  # what it thought cost tokens too

    def test_reasoning_counts_in_the_estimated_completion_tokens(self, raw_server, transport):
        """Without usage from the server, the completion estimate counts the reasoning written, not only the answer."""
        thought = " ".join(f"Perhaps line {i * 37} of module_{i * 7919 % 1000} drops the last record." for i in range(20))
        body = response_head() + sse(delta(reasoning_content=thought),
                                     delta(content="ok"), FINISH, "[DONE]")
        server = raw_server(lambda client, head: client.sendall(body))
        response = make_model(server.url, transport)[0].complete(MESSAGES, [])
        assert response.text == "ok" and response.completion_tokens > 200

    def test_a_trickle_that_never_ends_a_line_is_silence(self, raw_server, transport):
        """A byte at a time that never completes an event is silence from the model: watchdog_timeout at
        request_timeout_s. Each byte reset the direct transport's read timeout, so it waited the trickle out."""
        server: RawServer

        def trickle(client: socket.socket, head: bytes) -> None:
            client.sendall(response_head() + sse(delta(content="start")) + b"data: ")
            for _ in range(60):
                client.sendall(b"x")
                server.pause(0.1)

        server = raw_server(trickle)
        model, retries = make_model(server.url, transport, request_timeout_s=1.0)
        litellm_module()
        started = time.monotonic()
        with pytest.raises(QualityError) as caught:
            model.complete(MESSAGES, [])
        assert caught.value.reason == "watchdog_timeout" and time.monotonic() - started < 1.0 + 1.5

    def test_one_endless_line_is_runaway_output_not_memory(self, raw_server, transport):
        """One event that never ends is runaway_output once it passes what max_output_chars could need;
        it was held in memory as it grew (litellm: gigabytes in seconds)."""
        server: RawServer

        def endless_line(client: socket.socket, head: bytes) -> None:
            client.sendall(response_head() + b'data: {"choices":[{"index":0,"delta":{"content":"')
            for i in range(2000):
                client.sendall((f"word{i} " * 1000).encode())
                server.pause(0.001)

        server = raw_server(endless_line)
        model, _ = make_model(server.url, transport, max_output_chars=2000)
        litellm_module()
        started = time.monotonic()
        with pytest.raises(QualityError) as caught:
            model.complete(MESSAGES, [])
        assert caught.value.reason == "runaway_output" and "bytes" in caught.value.evidence
        assert time.monotonic() - started < 2.0


class TestCallsWithoutIndex:
    def test_calls_without_an_index_in_chunks_of_their_own_stay_apart(self, raw_server, transport):
        """Two calls streamed without `index`, each begun in a chunk of its own with its own id, and
        continued without one, are two calls; they were merged into one call with both arguments joined."""
        def begin(call_id: str, path_start: str) -> dict[str, Any]:
            return delta(tool_calls=[{"id": call_id, "type": "function", "function": {"name": "read_file", "arguments": path_start}}])

        def more(arguments: str) -> dict[str, Any]:
            return delta(tool_calls=[{"function": {"arguments": arguments}}])

        finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
        body = response_head() + sse(begin("a", '{"path": '), more('"a.py"}'), begin("b", '{"path": "b.py"}'), finish, "[DONE]")
        server = raw_server(lambda client, head: client.sendall(body))
        response = make_model(server.url, transport)[0].complete(MESSAGES, [])
        assert [(c.id, c.arguments) for c in response.tool_calls] == [("a", '{"path": "a.py"}'), ("b", '{"path": "b.py"}')]


class TestRetryAfter:
    @pytest.mark.parametrize(
        ("header", "least"),
        [
            ("7", 7.0),
            ("100000", 300.0 * 0.99),
            ("Fri, 01 Jan 2100 00:00:00 GMT", 300.0 * 0.99),
            ("Mon, 01 Jan 2024 00:00:00 +99999999999999999999", 0.0),
            ("\u00b2", 0.0),
        ],
        ids=["seconds", "past-the-ceiling", "http-date", "date-out-of-range", "not-a-number"],
    )
    def test_a_servers_retry_after_is_the_least_wait(self, raw_server, transport, header, least):
        """A 429 with Retry-After waits at least that long before the retry (never past MAX_BACKOFF_S);
        the doubling backoff alone retried after a second into a server that had said when to come back."""
        body = b'{"error": {"message": "rate limited"}}'
        head = response_head("429 Too Many Requests", "application/json", f"Retry-After: {header}\r\n", len(body))
        busy = head.replace(header.encode(), header.encode("latin-1")) + body  # a raw byte, as a server sends it
        server = raw_server(first_then_good(busy))
        slept: list[float] = []
        config = ModelConfig(name="openai/x", api_base=server.url, retries=1, retry_backoff_s=1.0, transport=transport)
        assert EndpointModel(config, sleep=slept.append).complete(MESSAGES, []).text == "Hello world"
        assert len(slept) == 1 and least <= slept[0] <= 300.0 * 1.25


class TestCallsAtTheSameIndex:
    def test_whole_calls_each_at_index_0_stay_apart(self, raw_server, transport):
        """Ollama's /v1 streams each whole call in a chunk of its own, every one at index 0 with its own id
        (ollama/ollama#15457): two reads were one call of '{"path": "a.py"}{"path": "b.py"}', both lost."""
        def whole(call_id: str, path: str) -> dict[str, Any]:
            arguments = json.dumps({"path": path})
            return delta(tool_calls=[{"id": call_id, "index": 0, "type": "function", "function": {"name": "read_file", "arguments": arguments}}])

        finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
        body = response_head() + sse(whole("call_a", "a.py"), whole("call_b", "b.py"), finish, "[DONE]")
        server = raw_server(lambda client, head: client.sendall(body))
        response = make_model(server.url, transport)[0].complete(MESSAGES, [])
        assert [(c.id, c.arguments) for c in response.tool_calls] == [("call_a", '{"path": "a.py"}'), ("call_b", '{"path": "b.py"}')]

    def test_a_new_id_on_each_piece_of_one_call_does_not_split_it(self, raw_server, transport):
        """A piece that names no tool continues the call at its index, whatever id it carries."""
        begin = delta(tool_calls=[{"id": "x1", "index": 0, "type": "function", "function": {"name": "read_file", "arguments": '{"path": '}}])
        more = delta(tool_calls=[{"id": "x2", "index": 0, "function": {"arguments": '"a.py"}'}}])
        finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
        body = response_head() + sse(begin, more, finish, "[DONE]")
        server = raw_server(lambda client, head: client.sendall(body))
        response = make_model(server.url, transport)[0].complete(MESSAGES, [])
        assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [("x1", "read_file", '{"path": "a.py"}')]
