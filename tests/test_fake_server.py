"""ScriptedServer speaks enough of the OpenAI chat API, checked with a plain HTTP client."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from orchestrator.fake_server import ScriptedServer
from orchestrator.scripted import Reply, calls, say


def post(server: ScriptedServer, body: dict, timeout: float = 5) -> tuple[int, bytes]:
    request = urllib.request.Request(
        server.url + "/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def events(raw: bytes) -> list[dict | str]:
    found: list[dict | str] = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            found.append(data if data == "[DONE]" else json.loads(data))
    return found


def handler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if "process_request_thread" in t.name]


BODY = {"model": "scripted", "messages": [{"role": "user", "content": "hello there, model"}]}


class TestRoutes:
    def test_health_and_models(self):
        """GET /health answers ok and GET /v1/models lists one model."""
        with ScriptedServer() as server:
            base = server.url.removesuffix("/v1")
            with urllib.request.urlopen(base + "/health", timeout=5) as response:
                assert json.load(response) == {"status": "ok"}
            with urllib.request.urlopen(server.url + "/models", timeout=5) as response:
                assert json.load(response)["data"][0]["id"] == "scripted"

    def test_plain_completion_and_recorded_request(self):
        """A non-streamed request gets a chat.completion with tool calls and usage; the body is recorded."""
        with ScriptedServer([calls(("read_file", {"path": "a"}), prompt_tokens=11)]) as server:
            status, raw = post(server, BODY)
        answer = json.loads(raw)
        assert status == 200 and answer["object"] == "chat.completion"
        call = answer["choices"][0]["message"]["tool_calls"][0]
        assert call["function"] == {"name": "read_file", "arguments": '{"path": "a"}'}
        assert answer["choices"][0]["finish_reason"] == "tool_calls"
        assert answer["usage"]["prompt_tokens"] == 11 and answer["usage"]["completion_tokens"] > 0
        assert server.requests == [BODY]

    def test_exhausted_script_answers_empty(self):
        """With no reply left the answer is an empty assistant message, counted in exhausted."""
        with ScriptedServer() as server:
            status, raw = post(server, BODY)
        assert status == 200
        assert json.loads(raw)["choices"][0]["message"]["content"] == ""
        assert server.exhausted == 1

    def test_error_status(self):
        """A reply with a status answers it with an OpenAI-style error body."""
        with ScriptedServer([Reply(status=503), say("after")]) as server:
            status, raw = post(server, BODY)
            assert status == 503 and "error" in json.loads(raw)
            assert json.loads(post(server, BODY)[1])["choices"][0]["message"]["content"] == "after"


class TestStreaming:
    def test_stream_chunks(self):
        """Reasoning, then text, then tool calls split over chunks, a finish chunk, usage and [DONE]."""
        reply = calls(("edit_file", {"path": "x.py", "old": "a", "new": "b"}), chunk_chars=4)
        reply = Reply(text="Editing now.", tool_calls=reply.tool_calls, reasoning="hmm", chunk_chars=4)
        with ScriptedServer([reply]) as server:
            _, raw = post(server, {**BODY, "stream": True, "stream_options": {"include_usage": True}})
        found = events(raw)
        assert found[-1] == "[DONE]"
        chunks = [e for e in found if isinstance(e, dict)]
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        assert "".join(d.get("reasoning_content", "") for d in deltas) == "hmm"
        assert "".join(d.get("content") or "" for d in deltas) == "Editing now."
        pieces = [d["tool_calls"][0]["function"]["arguments"] for d in deltas if "tool_calls" in d]
        assert len(pieces) > 3 and "".join(pieces) == reply.tool_calls[0].arguments
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0

    def test_endless_stops_when_client_hangs_up(self):
        """An endless stream ends when the client disconnects, and the server stays usable."""
        with ScriptedServer([Reply(endless="again ", chunk_interval_s=0.01), say("next")]) as server:
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
            connection.request("POST", "/v1/chat/completions", json.dumps({**BODY, "stream": True}))
            response = connection.getresponse()
            assert b"again" in response.read(2000)
            assert handler_threads()  # still streaming
            connection.close()
            deadline = time.monotonic() + 3
            while handler_threads() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert handler_threads() == []
            assert json.loads(post(server, BODY)[1])["choices"][0]["message"]["content"] == "next"

    def test_a_client_hanging_up_mid_answer_is_recorded_and_a_whole_answer_is_not(self):
        """A stream its client closed before the end is one `hang_ups` entry and leaves no connection open; an
        answer read to its end, its connection closed after, is none."""
        with ScriptedServer([say("whole"), Reply(text="word " * 400, chunk_chars=5, chunk_interval_s=0.01)]) as server:
            assert post(server, {**BODY, "stream": True})[0] == 200
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
            connection.request("POST", "/v1/chat/completions", json.dumps({**BODY, "stream": True}))
            assert b"word" in connection.getresponse().read(2000)
            connection.close()
            deadline = time.monotonic() + 3
            while (server.open_connections or not server.hang_ups) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(server.hang_ups) == 1 and server.open_connections == 0

    def test_stop_does_not_wait_for_a_stalled_reply(self):
        """stop() returns promptly even while a handler is sleeping through a long stall."""
        server = ScriptedServer([Reply(text="stalling", stall_s=30)]).start()
        cut_off: list[BaseException] = []

        def read_until_cut() -> None:
            try:
                post(server, {**BODY, "stream": True}, 30)
            except http.client.IncompleteRead as exc:  # the stop cuts the stream: expected here
                cut_off.append(exc)

        client = threading.Thread(target=read_until_cut, daemon=True)
        client.start()
        time.sleep(0.2)
        started = time.monotonic()
        server.stop()
        client.join(timeout=5)
        assert time.monotonic() - started < 3
        assert not client.is_alive()

    def test_url_needs_a_started_server(self):
        """Asking for the url before start() is an error, not a wrong port."""
        with pytest.raises(RuntimeError):
            ScriptedServer().url
