"""EndpointModel against a real HTTP server, through both transports: direct HTTP and real litellm."""

from __future__ import annotations

import errno
import json
import math
import os
import random
import socket
import subprocess
import sys
import threading
import time

from typing import Any

import pytest

from orchestrator.config import ModelConfig, load_config
from orchestrator.cancel import CancelToken
from orchestrator.errors import Cancelled, ConfigError, ModelUnreachable, QualityError
from orchestrator.fake_server import ScriptedServer
from orchestrator.litellm_transport import litellm_module
from orchestrator.transport_choice import uses_direct_http
from orchestrator import watchdog
from orchestrator.model import EndpointModel
from orchestrator.records import ModelResponse, RawToolCall
from orchestrator.scripted import Reply, call, calls, say
from tests.conftest import RawServer

MESSAGES = [{"role": "user", "content": "Fix the failing test, please."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }
]


@pytest.fixture
def server():
    with ScriptedServer() as scripted:
        yield scripted


@pytest.fixture(params=["direct", "litellm"])
def transport(request) -> str:
    return request.param


@pytest.fixture
def make_model(transport):
    def make(url: str, **options) -> tuple[EndpointModel, list[tuple[int, str]]]:
        config = ModelConfig(
            name=options.pop("name", "openai/scripted"),
            api_base=url,
            request_timeout_s=options.pop("request_timeout_s", 5.0),
            retries=options.pop("retries", 2),
            retry_backoff_s=options.pop("retry_backoff_s", 0.0),
            transport=options.pop("transport", transport),
        )
        retries: list[tuple[int, str]] = []
        model = EndpointModel(config, sleep=lambda s: None, on_retry=lambda n, why: retries.append((n, why)), **options)
        return model, retries

    return make


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TestAnswers:
    def test_streamed_text(self, server, make_model):
        """Streamed text arrives whole, with a stop reason and a latency."""
        server.enqueue(say("The bug is in parse(); it drops the last line of the input."))
        model, _ = make_model(server.url)
        response = model.complete(MESSAGES, TOOLS)
        assert response.text == "The bug is in parse(); it drops the last line of the input."
        assert response.tool_calls == ()
        assert response.finish_reason == "stop"
        assert response.latency_s > 0

    def test_request_carries_messages_tools_and_settings(self, server, make_model):
        """The server sees the messages, the tools with tool_choice auto, and a streamed request."""
        server.enqueue(say("ok"))
        model, _ = make_model(server.url)
        model.complete(MESSAGES, TOOLS)
        body = server.requests[0]
        assert body["messages"] == MESSAGES
        assert body["tools"][0]["function"]["name"] == "read_file"
        assert body["tool_choice"] == "auto"
        assert body["stream"] is True
        assert body["max_tokens"] == 2048
        assert body["model"] == "scripted"  # litellm's "openai/" route prefix is not sent
        # vLLM and llama-server send a stream's usage only when asked: without it every count is an estimate.
        assert body["stream_options"] == {"include_usage": True}

    @pytest.mark.parametrize("transport", ["direct", "litellm"])
    def test_a_small_window_asks_for_a_quarter_of_it_unless_max_tokens_is_set(self, server, transport):
        """2048 answer tokens are half of a 4096-token window (vLLM refuses prompt + max_tokens past the window):
        left at its default, max_tokens is a quarter of a known window; set, it is sent as set."""
        for options, sent in (({}, 1024), ({"max_tokens": 3000}, 3000)):
            server.enqueue(say("ok"))
            config = ModelConfig(name="openai/scripted", api_base=server.url, context_window=4096, transport=transport, **options)
            EndpointModel(config).complete(MESSAGES, TOOLS)
            assert server.requests[-1]["max_tokens"] == sent

    def test_a_tiny_window_still_asks_for_the_answer_floor(self, server, transport):
        """A quarter of an 800-token window is 200 tokens, too few for one tool call: at least ANSWER_FLOOR is asked."""
        from orchestrator.model import ANSWER_FLOOR

        server.enqueue(say("ok"))
        config = ModelConfig(name="openai/scripted", api_base=server.url, context_window=800, transport=transport)
        EndpointModel(config).complete(MESSAGES, TOOLS)
        assert server.requests[-1]["max_tokens"] == ANSWER_FLOOR == 256

    def test_no_tools_sends_no_tool_choice(self, server, make_model):
        """Without tools the request has neither tools nor tool_choice."""
        server.enqueue(say("ok"))
        model, _ = make_model(server.url)
        model.complete(MESSAGES, [])
        assert "tools" not in server.requests[0]
        assert "tool_choice" not in server.requests[0]

    def test_streamed_native_tool_calls(self, server, make_model):
        """Two tool calls in one reply, arguments split over many chunks, come back whole and in order."""
        long_path = "src/" + "deeply/" * 6 + "module.py"
        server.enqueue(calls(("read_file", {"path": long_path}), ("list_dir", {"path": "tests"}), chunk_chars=5))
        model, _ = make_model(server.url)
        response = model.complete(MESSAGES, TOOLS)
        assert response.tool_calls == (
            RawToolCall(name="read_file", arguments=json.dumps({"path": long_path}), id="call_0"),
            RawToolCall(name="list_dir", arguments=json.dumps({"path": "tests"}), id="call_1"),
        )
        assert response.finish_reason == "tool_calls"

    def test_not_streamed(self, server, make_model):
        """With stream=False the plain completion is read, tool calls and usage included."""
        server.enqueue(calls(("read_file", {"path": "a.py"}), prompt_tokens=70, completion_tokens=9))
        model, _ = make_model(server.url, stream=False)
        response = model.complete(MESSAGES, TOOLS)
        assert "stream" not in server.requests[0] or server.requests[0]["stream"] is False
        assert response.tool_calls == (RawToolCall(name="read_file", arguments='{"path": "a.py"}', id="call_0"),)
        assert (response.prompt_tokens, response.completion_tokens) == (70, 9)

    def test_usage_figures_from_server(self, server, make_model):
        """The server's usage figures are kept as they are."""
        server.enqueue(say("done", prompt_tokens=1234, completion_tokens=56))
        model, _ = make_model(server.url)
        response = model.complete(MESSAGES, TOOLS)
        assert (response.prompt_tokens, response.completion_tokens) == (1234, 56)

    def test_reasoning_kept_apart(self, server, make_model):
        """Reasoning deltas go to response.reasoning, not into the text."""
        server.enqueue(say("Answer.", reasoning="First I think about the parser, then the tests."))
        model, _ = make_model(server.url)
        response = model.complete(MESSAGES, TOOLS)
        assert response.reasoning == "First I think about the parser, then the tests."
        assert response.text == "Answer."

    @pytest.mark.parametrize(
        "answer",
        [
            '<think>Read it first.</think>\n<think>Or {"name": "write_file", "arguments": {"path": "a.py", "content": ""}}?</think>\nLet me read.',
            'Let me look.\n<think>\nI would then call <tool_call>{"name": "submit", "arguments": {"summary": "done"}}</tool_call>\n</think>\nLet me read.',
        ],
        ids=["second-block", "after-a-line-of-prose"],
    )
    def test_a_call_considered_in_a_later_thinking_block_is_not_made(self, server, make_model, answer):
        """A second `<think>` block, or one after a line of prose, left in the text by a server without a
        reasoning parser, is thinking too: only the first block at the very start was set apart, and the
        call the model only considered in the next one ran (a submit it had not made, an emptied file)."""
        from orchestrator.toolcalls import parse_calls
        from orchestrator.tool_schemas import schemas_of

        server.enqueue(say(answer))
        response = make_model(server.url)[0].complete(MESSAGES, TOOLS)
        assert parse_calls(response, schemas_of(["read_file", "write_file", "submit"])) == []
        assert "<think>" not in response.text and response.text.endswith("Let me read.")
        assert "would then call" in response.reasoning or "Or {" in response.reasoning

    def test_thinking_tags_after_a_calls_beginning_are_the_calls_own(self, server, make_model):
        """A tag once a written call has begun is the answer's own (a file that holds one): it stays."""
        answer = 'Writing it.\n{"name": "write_file", "arguments": {"path": "p.py", "content": "x = 1\\n<think>\\ny = 2"}}'
        server.enqueue(say(answer))
        response = make_model(server.url)[0].complete(MESSAGES, TOOLS)
        assert response.text == answer and response.reasoning == ""

    def test_context_window_falls_back_to_config(self):
        """A model litellm does not know gets the configured context window."""
        config = ModelConfig(name="openai/no-such-model-xyz", api_base="http://127.0.0.1:9/v1", context_window=8192)
        assert EndpointModel(config).context_window() == 8192

    def test_context_window_from_litellm(self):
        """A model litellm knows gets its input token limit from litellm."""
        window = EndpointModel(ModelConfig(name="gpt-4o", context_window=1000)).context_window()
        assert window is not None and window > 100_000


class TestFailures:
    def test_5xx_is_retried(self, server, make_model):
        """A 503 then a success: retried once, on_retry told why, the answer returned."""
        server.enqueue(Reply(status=503), say("back again"))
        model, retries = make_model(server.url)
        assert model.complete(MESSAGES, TOOLS).text == "back again"
        assert [n for n, _ in retries] == [1]
        assert "503" in retries[0][1] or "ServiceUnavailable" in retries[0][1]
        assert len(server.requests) == 2

    def test_rate_limit_is_retried(self, server, make_model):
        """A 429 counts as a passing outage and is retried."""
        server.enqueue(Reply(status=429), say("ok"))
        model, retries = make_model(server.url)
        assert model.complete(MESSAGES, TOOLS).text == "ok"
        assert len(retries) == 1

    def test_server_down_is_unreachable_after_retries(self, make_model):
        """Nothing listening: every retry is spent, then ModelUnreachable names the endpoint."""
        url = f"http://127.0.0.1:{free_port()}/v1"
        model, retries = make_model(url, retries=2)
        with pytest.raises(ModelUnreachable) as caught:
            model.complete(MESSAGES, TOOLS)
        assert [n for n, _ in retries] == [1, 2]
        assert url in str(caught.value)
        assert "\n" not in str(caught.value)

    def test_backoff_doubles(self, server, transport):
        """Backoff starts at retry_backoff_s and doubles, with jitter."""
        server.enqueue(Reply(status=500), Reply(status=502), Reply(status=500))
        slept: list[float] = []
        config = ModelConfig(name="openai/scripted", api_base=server.url, retries=3, retry_backoff_s=1.0, transport=transport)
        model = EndpointModel(config, sleep=slept.append)
        assert model.complete(MESSAGES, TOOLS).text == ""  # the script ran out: empty answer
        assert len(slept) == 3
        assert 0.7 <= slept[0] <= 1.3 and 1.4 <= slept[1] <= 2.6 and 2.9 <= slept[2] <= 5.1

    def test_backoff_stops_doubling_at_its_ceiling(self, server, transport):
        """Twenty failures from 2 s would wait days the last time; each wait stays within MAX_BACKOFF_S, its
        jitter included (jitter applied after the ceiling reached 1.25 times it)."""
        from orchestrator.retries import MAX_BACKOFF_S

        server.enqueue(*[Reply(status=503)] * 20)
        slept: list[float] = []
        config = ModelConfig(name="openai/scripted", api_base=server.url, retries=20, retry_backoff_s=2.0, transport=transport)
        EndpointModel(config, sleep=slept.append).complete(MESSAGES, TOOLS)
        assert len(slept) == 20 and max(slept) <= MAX_BACKOFF_S and slept[-1] >= MAX_BACKOFF_S * 0.75

    def test_backoff_has_jitter(self, server):
        """Parallel tasks whose server went down together must not retry in lockstep: each wait is the
        doubling one times a jitter within +-25%, not the same factor every time."""
        server.enqueue(*[Reply(status=503)] * 6)
        slept: list[float] = []
        config = ModelConfig(name="openai/scripted", api_base=server.url, retries=6, retry_backoff_s=1.0, transport="direct")
        EndpointModel(config, sleep=slept.append).complete(MESSAGES, TOOLS)
        factors = [wait / 2**n for n, wait in enumerate(slept)]
        assert len(factors) == 6 and all(0.75 <= factor <= 1.25 for factor in factors)
        assert len({round(factor, 6) for factor in factors}) > 1

    def test_a_first_backoff_past_the_ceiling_is_its_own_ceiling(self, server):
        """retry_backoff_s above MAX_BACKOFF_S (a server that takes 10 minutes to restart) is waited in full, not cut to 300 s."""
        server.enqueue(Reply(status=503), Reply(status=503))
        slept: list[float] = []
        config = ModelConfig(name="openai/scripted", api_base=server.url, retries=2, retry_backoff_s=600.0, transport="direct")
        EndpointModel(config, sleep=slept.append).complete(MESSAGES, TOOLS)
        assert len(slept) == 2 and all(450.0 <= wait <= 600.0 for wait in slept) and slept[1] == 600.0

    @pytest.mark.parametrize(("status", "retried"), [(408, True), (409, True), (425, True), (402, False), (407, False)])
    def test_every_documented_status_is_retried_or_refused_as_documented(self, server, make_model, status, retried):
        """[model] retries: 408, 409, 425, 429 and 5xx are retried; 401, 402, 403, 404 and 407 are model_unreachable at once."""
        server.enqueue(Reply(status=status), say("back again"))
        model, retries = make_model(server.url, retries=1)
        if retried:
            assert model.complete(MESSAGES, TOOLS).text == "back again"
            assert len(retries) == 1 and len(server.requests) == 2
        else:
            with pytest.raises(ModelUnreachable, match=str(status)):
                model.complete(MESSAGES, TOOLS)
            assert retries == [] and len(server.requests) == 1

    @pytest.mark.parametrize("status", [401, 403, 404])
    def test_refused_configuration_is_unreachable_at_once(self, server, status, make_model):
        """A bad key or unknown model is never retried: ModelUnreachable at once."""
        server.enqueue(Reply(status=status), say("never reached"))
        model, retries = make_model(server.url)
        with pytest.raises(ModelUnreachable, match=str(status)):
            model.complete(MESSAGES, TOOLS)
        assert retries == []
        assert len(server.requests) == 1

    def test_bad_request_is_a_plain_error(self, server, make_model):
        """A 400 is neither an outage nor the model's struggle: a RuntimeError, not retried."""
        server.enqueue(Reply(status=400))
        model, retries = make_model(server.url)
        with pytest.raises(RuntimeError, match="400") as caught:
            model.complete(MESSAGES, TOOLS)
        assert not isinstance(caught.value, (ModelUnreachable, QualityError))
        assert retries == []

    def test_unroutable_model_name_is_unreachable(self, server, make_model):
        """A name litellm cannot route is a configuration problem, reported at once."""
        model, retries = make_model(server.url, name="no-provider-model-xyz", transport="litellm")
        with pytest.raises(ModelUnreachable, match="no-provider-model-xyz"):
            model.complete(MESSAGES, TOOLS)
        assert retries == []

    def test_errors_print_nothing(self, server, capfd, make_model):
        """litellm's help banners stay off stdout and stderr."""
        server.enqueue(Reply(status=404))
        model, _ = make_model(server.url)
        with pytest.raises(ModelUnreachable):
            model.complete(MESSAGES, TOOLS)
        out, err = capfd.readouterr()
        assert "Give Feedback" not in out + err and "LiteLLM.Info" not in out + err


class TestWatchdog:
    def test_stall_after_first_chunk(self, server, make_model):
        """A stream that falls silent past the timeout is cut: watchdog_timeout, not retried."""
        server.enqueue(Reply(text="starting to answer", stall_s=6), say("never reached"))
        model, retries = make_model(server.url, request_timeout_s=1.0)
        litellm_module()  # its first import takes seconds, which the time below is not about
        started = time.monotonic()
        with pytest.raises(QualityError) as caught:
            model.complete(MESSAGES, TOOLS)
        assert caught.value.reason == "watchdog_timeout"
        assert "1 s" in caught.value.evidence
        assert time.monotonic() - started < 1.0 + 1.5
        assert retries == [] and len(server.requests) == 1

    def test_keep_alive_comments_are_not_the_model_speaking(self):
        """A proxy that sends SSE keep-alive comments while the model says nothing is still silence:
        the watchdog cuts it. (Before, the comments kept the socket busy and the night waited forever.)"""
        stop = threading.Event()

        def keep_alive(client: socket.socket, head: bytes) -> None:
            client.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
            client.sendall(b'data: {"choices": [{"delta": {"content": "thinking"}}]}\n\n')
            while not stop.wait(0.1):
                client.sendall(b": keep-alive\n\n")

        proxy = RawServer(keep_alive)
        model = EndpointModel(ModelConfig(name="openai/x", api_base=proxy.url, request_timeout_s=1.0, retries=0, transport="direct"))
        started = time.monotonic()
        try:
            with pytest.raises(QualityError) as caught:
                model.complete(MESSAGES, TOOLS)
        finally:
            stop.set()
            model.close()
            proxy.close()
        assert caught.value.reason == "watchdog_timeout" and time.monotonic() - started < 1.0 + 1.5

    def test_silence_before_first_byte(self, server, make_model):
        """No headers within the timeout is the same watchdog_timeout."""
        server.enqueue(Reply(text="late", delay_s=6))
        model, _ = make_model(server.url, request_timeout_s=1.0)
        started = time.monotonic()
        with pytest.raises(QualityError, match="watchdog_timeout"):
            model.complete(MESSAGES, TOOLS)
        assert time.monotonic() - started < 1.0 + 1.5

    def test_slow_living_stream_is_not_cut(self, server, make_model):
        """Chunks every 0.3 s for longer than the timeout in total are a living stream."""
        text = "slow but steady " * 4
        server.enqueue(Reply(text=text, chunk_chars=8, chunk_interval_s=0.3))
        model, _ = make_model(server.url, request_timeout_s=1.0)
        response = model.complete(MESSAGES, TOOLS)
        assert response.text == text
        assert response.latency_s > 1.5

    def test_non_streamed_silence(self, server, make_model):
        """Without streaming the whole request is bounded by the timeout."""
        server.enqueue(Reply(text="late", delay_s=6))
        model, _ = make_model(server.url, request_timeout_s=1.0, stream=False)
        started = time.monotonic()
        with pytest.raises(QualityError, match="watchdog_timeout"):
            model.complete(MESSAGES, TOOLS)
        assert time.monotonic() - started < 1.0 + 1.5


class TestCancel:
    def test_cancel_cuts_a_silent_request_at_once(self, server, transport):
        """A cancel (SIGTERM, the deadline) while the server is silent ends the call within a moment, not at the timeout."""
        server.enqueue(Reply(text="late", delay_s=20))
        token = CancelToken()
        config = ModelConfig(name="openai/scripted", api_base=server.url, request_timeout_s=30, transport=transport)
        model = EndpointModel(config, cancel=token)
        litellm_module()  # its import takes seconds; not what is timed here
        threading.Timer(0.3, token.cancel, args=("SIGTERM",)).start()
        started = time.monotonic()
        with pytest.raises(Cancelled, match="SIGTERM"):
            model.complete(MESSAGES, TOOLS)
        assert time.monotonic() - started < 2.0

    def test_a_tasks_cancel_cuts_its_own_call_and_not_another_tasks(self, server, transport):
        """One task's token (a lost lease) cuts that task's streaming call within a moment, its tokens counted, while
        another task's call on the same night model streams on to its end; the night's token cuts both."""
        slow = say(" ".join(f"word{n}" for n in range(60)), chunk_chars=8, chunk_interval_s=0.05)  # about 2.5 s
        server.enqueue(slow, slow, slow)
        night = CancelToken()
        config = ModelConfig(name="openai/scripted", api_base=server.url, request_timeout_s=30, transport=transport)
        shared = EndpointModel(config, cancel=night)
        litellm_module()  # its import takes seconds; not what is timed here
        losing, going_on = night.child(), night.child()
        other: list[Any] = []
        beside = threading.Thread(target=lambda: other.append(shared.for_task(going_on).complete(MESSAGES, TOOLS)))
        beside.start()
        threading.Timer(0.5, losing.cancel, args=("lease_lost",)).start()
        started = time.monotonic()
        with pytest.raises(Cancelled, match="lease_lost") as cut:
            shared.for_task(losing).complete(MESSAGES, TOOLS)
        assert time.monotonic() - started < 2.0 and cut.value.tokens > 0
        beside.join(timeout=10)
        assert [response.text for response in other] == [slow.text] and not going_on.cancelled
        threading.Timer(0.5, night.cancel, args=("SIGTERM",)).start()
        with pytest.raises(Cancelled, match="SIGTERM"):
            shared.for_task(going_on).complete(MESSAGES, TOOLS)
        assert shared.client_cpu_s > 0

    def test_a_task_model_closed_leaves_another_tasks_call_streaming(self, server, transport):
        """A task that ends closes its model while another task's answer still streams: that answer arrives whole and
        is not asked again (litellm's clients are cached for the whole process, so closing them cut the other call)."""
        slow = say(" ".join(f"word{n}" for n in range(60)), chunk_chars=8, chunk_interval_s=0.05)  # about 2.5 s
        server.enqueue(slow, say("quick"))
        night = CancelToken()
        config = ModelConfig(name="openai/scripted", api_base=server.url, request_timeout_s=30, transport=transport)
        shared = EndpointModel(config, cancel=night)
        litellm_module()
        streaming, ending = shared.for_task(night.child()), shared.for_task(night.child())
        other: list[Any] = []
        beside = threading.Thread(target=lambda: other.append(streaming.complete(MESSAGES, TOOLS)))
        beside.start()
        time.sleep(0.5)
        assert ending.complete(MESSAGES, TOOLS).text == "quick"
        ending.close()
        beside.join(timeout=30)
        streaming.close()
        assert [response.text for response in other] == [slow.text] and len(server.requests) == 2

    def test_cancel_ends_the_wait_between_retries_at_once(self, server, transport):
        """A cancel during the backoff after a 503 ends the call within a moment; it sat out the whole wait
        (up to 300 s a wait, so SIGTERM took minutes to stop a night whose server was down)."""
        server.enqueue(Reply(status=503), Reply(status=503))
        token = CancelToken()
        config = ModelConfig(name="openai/scripted", api_base=server.url, retries=2, retry_backoff_s=30, transport=transport)
        model = EndpointModel(config, cancel=token)
        litellm_module()  # its import takes seconds; not what is timed here
        threading.Timer(0.5, token.cancel, args=("SIGTERM",)).start()
        started = time.monotonic()
        with pytest.raises(Cancelled, match="SIGTERM"):
            model.complete(MESSAGES, TOOLS)
        assert time.monotonic() - started < 2.5 and len(server.requests) == 1

    def test_cancel_ends_the_silence_probe_of_a_stopped_server_at_once(self, transport):
        """A cancel while a silent server is asked `GET /` (it takes connections, answers nothing) ends the call within a
        moment; the probe was waited out (up to 30 s), so SIGTERM took that long to stop a night whose server was wedged."""
        stopped = socket.socket()  # listening, never accepting: the kernel takes the connections, nobody answers
        stopped.bind(("127.0.0.1", 0))
        stopped.listen(16)
        token = CancelToken()
        url = f"http://127.0.0.1:{stopped.getsockname()[1]}/v1"
        model = EndpointModel(ModelConfig(name="openai/scripted", api_base=url, request_timeout_s=4, retries=0, transport=transport), cancel=token)
        litellm_module()  # its import takes seconds; not what is timed here
        threading.Timer(5.5, token.cancel, args=("SIGTERM",)).start()  # silent for 4 s (5 s at most under litellm), then the probe's 4 s
        started = time.monotonic()
        try:
            with pytest.raises(Cancelled, match="SIGTERM"):
                model.complete(MESSAGES, TOOLS)
        finally:
            model.close()
            stopped.close()
        assert time.monotonic() - started < 5.5 + 1.5

    def test_cancel_ends_the_start_ups_context_window_ask_of_a_stopped_server_at_once(self):
        """A signal while a night's start-up asks a stopped server for its context window leaves the window unknown within
        a moment; the asks were waited out (two, up to 5 s each), so a SIGTERM then took up to 10 s to stop the night."""
        stopped = socket.socket()  # listening, never accepting: the kernel takes the connections, nobody answers
        stopped.bind(("127.0.0.1", 0))
        stopped.listen(16)
        token = CancelToken()
        url = f"http://127.0.0.1:{stopped.getsockname()[1]}/v1"
        model = EndpointModel(ModelConfig(name="openai/unknown-to-litellm", api_base=url, request_timeout_s=5, transport="direct"), cancel=token)
        litellm_module()  # its import takes seconds; not what is timed here
        threading.Timer(0.5, token.cancel, args=("SIGTERM",)).start()
        started = time.monotonic()
        try:
            assert model.context_window(ask_server=True) is None
        finally:
            model.close()
            stopped.close()
        assert time.monotonic() - started < 0.5 + 1.5

    def test_a_night_cancelled_before_its_start_up_asks_its_server_nothing(self, server):
        """A signal that came before the context-window asks (during the imports, the config) sends none of them: they
        were started in their helper thread all the same, and went to the server of a night told to stop."""
        server.props = {"default_generation_settings": {"n_ctx": 4096}}
        token = CancelToken()
        token.cancel("SIGTERM")
        model = EndpointModel(ModelConfig(name="openai/unknown-to-litellm", api_base=server.url, transport="direct"), cancel=token)
        try:
            assert model.context_window(ask_server=True) is None
            time.sleep(0.5)  # time for an abandoned ask to arrive
        finally:
            model.close()
        assert server.other_requests == []

    @pytest.mark.parametrize("failure", [ConnectionRefusedError(111, "refused"), TimeoutError("timed out"), KeyboardInterrupt()])
    def test_what_a_request_asked_beside_the_chat_raises_reaches_its_caller_as_it_was(self, failure):
        """The helper thread hands back what the request raised, the same object, never a cancel, when none came."""
        def ask() -> None:
            raise failure

        with pytest.raises(type(failure)) as raised:
            watchdog.asked_unless_cancelled(ask, CancelToken())
        assert raised.value is failure

    def test_an_answer_asked_beside_the_chat_is_returned_at_once(self):
        """Without a cancel the answer comes back as it came, without waiting for the cancel's next look."""
        started = time.monotonic()
        for _ in range(5):
            assert watchdog.asked_unless_cancelled(lambda: 4096, CancelToken()) == 4096
            assert watchdog.asked_unless_cancelled(lambda: None, None) is None
        assert time.monotonic() - started < 0.5  # a look at the cancel first would take 0.1 s a call: 1 s

    def test_a_cancelled_token_stops_the_next_call_before_it_is_sent(self, server, transport):
        token = CancelToken()
        token.cancel("deadline")
        model = EndpointModel(ModelConfig(name="openai/scripted", api_base=server.url, transport=transport), cancel=token)
        with pytest.raises(Cancelled, match="deadline"):
            model.complete(MESSAGES, TOOLS)
        assert server.requests == []


class TestRunaway:
    def test_endless_repetition_is_cut(self, server, make_model):
        """A stream repeating one chunk over and over is cut as runaway_output, long before the cap."""
        server.enqueue(Reply(text="Let me check. ", endless="I will read the file again. "))
        model, retries = make_model(server.url)
        with pytest.raises(QualityError) as caught:
            model.complete(MESSAGES, TOOLS)
        assert caught.value.reason == "runaway_output"
        assert "repeats" in caught.value.evidence
        assert retries == []

    def test_too_long_output_is_cut(self, server, make_model):
        """Varied output past max_output_chars is cut as runaway_output."""
        varied = " ".join(f"word{i}" for i in range(600))
        server.enqueue(say(varied))
        model, _ = make_model(server.url, max_output_chars=1000)
        with pytest.raises(QualityError) as caught:
            model.complete(MESSAGES, TOOLS)
        assert caught.value.reason == "runaway_output"
        assert "1000" in caught.value.evidence

    def test_too_long_output_is_cut_without_streaming_too(self, server, make_model):
        """A whole (not streamed) answer past max_output_chars is runaway_output as a streamed one is."""
        varied = " ".join(f"word{i}" for i in range(600))
        server.enqueue(say(varied))
        model, _ = make_model(server.url, max_output_chars=1000, stream=False)
        with pytest.raises(QualityError) as caught:
            model.complete(MESSAGES, TOOLS)
        assert caught.value.reason == "runaway_output" and "1000" in caught.value.evidence

    def test_runaway_tool_arguments_are_cut(self, server, make_model):
        """Tool arguments that loop count as runaway output too, once the loop fills 4096 characters."""
        server.enqueue(Reply(tool_calls=(RawToolCall("write_file", '{"content": "' + "ab" * 2500),)))
        model, _ = make_model(server.url)
        with pytest.raises(QualityError, match="runaway_output") as caught:
            model.complete(MESSAGES, TOOLS)
        assert "over its last 4096 chars" in caught.value.evidence

    # What a test fixture or a data file may hold: an empty 20 x 30 board, a table of 200 zeros.
    REPETITIVE_FILES = ["\n".join(["." * 20] * 30) + "\n", "EXPECTED = [" + ", ".join(["0"] * 200) + "]\n"]

    @pytest.mark.parametrize("content", REPETITIVE_FILES, ids=["board", "zeros"])
    def test_a_file_that_repeats_a_short_unit_is_written_not_cut(self, server, make_model, content):
        """A write_file of an empty board or a table of zeros was cut as runaway output (the same 512
        characters of dots), every iteration again: the model cannot write such a file shorter."""
        arguments = json.dumps({"path": "fixtures/board.txt", "content": content})
        server.enqueue(Reply(tool_calls=(RawToolCall("write_file", arguments),)))
        model, _ = make_model(server.url)
        [written] = model.complete(MESSAGES, TOOLS).tool_calls
        assert json.loads(written.arguments)["content"] == content

    @pytest.mark.parametrize("content", REPETITIVE_FILES, ids=["board", "zeros"])
    def test_the_same_file_in_a_call_written_in_the_text_is_not_cut(self, server, make_model, content):
        text = "<tool_call>\n" + json.dumps({"name": "write_file", "arguments": {"path": "board.txt", "content": content}}) + "\n</tool_call>"
        server.enqueue(say(text))
        model, _ = make_model(server.url)
        assert model.complete(MESSAGES, TOOLS).text == text

    def test_a_call_whose_opening_is_split_between_chunks_widens_the_window_too(self, server, make_model):
        """`<tool_call>` arriving in two deltas ("...<tool_" then "call>...") still opens a written call."""
        content = self.REPETITIVE_FILES[0]
        text = "Writing it.\n<tool_call>\n" + json.dumps({"name": "write_file", "arguments": {"path": "board.txt", "content": content}}) + "\n</tool_call>"
        assert text.index("<tool_call>") < 16 < text.index("<tool_call>") + len("<tool_call>")  # split by the 16-character chunks
        server.enqueue(say(text, chunk_chars=16))
        model, _ = make_model(server.url)
        assert model.complete(MESSAGES, TOOLS).text == text

    def test_a_call_opened_in_one_large_chunk_widens_the_window_too(self):
        """A server (or proxy) that sends large deltas: the opening early in a 1000-character chunk was cut
        from the tail before it was looked for, and the zeros of the file were cut at 512."""
        from orchestrator.runaway import RepeatTail

        text = '<tool_call>{"name": "write_file", "arguments": {"path": "t.txt", "content": "' + "0 " * 2000
        tail = RepeatTail(may_hold_calls=True)
        for start in range(0, len(text), 1000):
            tail.add(text[start : start + 1000])
        assert tail.window == 4096 and tail.looping_unit() is None

    def test_text_that_repeats_before_any_call_is_still_cut_at_512_characters(self, server, make_model):
        server.enqueue(say("I think. " + "." * 600 + ' <tool_call>{"name": "read_file", "arguments": {"path": "a.py"}}</tool_call>'))
        model, _ = make_model(server.url)
        with pytest.raises(QualityError, match="runaway_output") as caught:
            model.complete(MESSAGES, TOOLS)
        assert "over its last 512 chars" in caught.value.evidence

    def test_varied_long_text_is_kept(self, server, make_model):
        """Long output that does not repeat and stays under the cap is an answer, not a runaway."""
        varied = "\n".join(f"line {i}: value {i * i}" for i in range(120))
        server.enqueue(say(varied))
        model, _ = make_model(server.url)
        assert model.complete(MESSAGES, TOOLS).text == varied


class TestImport:
    def test_import_does_not_load_litellm(self):
        """Importing the module is quick and leaves litellm unimported."""
        code = "import sys, orchestrator.model; print('litellm' in sys.modules)"
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert result.stdout.strip() == "False", result.stderr

    @pytest.mark.parametrize("collecting", [True, False])
    def test_litellms_objects_are_left_out_of_the_collectors_walks(self, collecting):
        """litellm's first import leaves hundreds of thousands of objects for the life of the process: no full
        collection walks them during the import, none after (frozen: a third of a second each with the GIL held,
        and seconds as the process exited); the collector is on afterwards, or off where the process had turned it off."""
        code = (
            "import gc, sys\n"
            "from orchestrator.litellm_transport import litellm_module\n"
            f"{'' if collecting else 'gc.disable()'}\n"
            "full = gc.get_stats()[2]['collections']\n"
            "litellm_module(); litellm_module()\n"
            "print(gc.get_stats()[2]['collections'] - full, gc.get_freeze_count(), gc.isenabled())"
        )
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        full_collections, frozen, enabled = result.stdout.split()
        assert (int(full_collections), enabled) == (0, str(collecting)), result.stderr
        assert int(frozen) > 100_000


class TestContextOverflow:
    def test_context_overflow_is_a_quality_stop_not_a_crash(self, transport):
        """llama.cpp's 400 for a prompt past the context becomes context_overflow, which the iteration notes."""
        with ScriptedServer([Reply(status=400, text="request (4130 tokens) exceeds the available context size (4096 tokens)")]) as server:
            config = ModelConfig(name="openai/x", api_base=server.url, request_timeout_s=5, retries=0, transport=transport)
            model = EndpointModel(config)
            with pytest.raises(QualityError) as stop:
                model.complete([{"role": "user", "content": "hi"}], [])
        assert stop.value.reason == "context_overflow"

    @pytest.mark.parametrize(
        ("status", "refusal"),
        [
            (400, "the request exceeds the available context size, try increasing it"),  # llama.cpp
            (500, "context shift is disabled"),  # llama.cpp, older
            (400, "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens."),  # vLLM
            (400, "The decoder prompt (length 5000) is longer than the maximum model length of 4096."),  # vLLM V1
            (400, "prompt too long; exceeded max context length by 904 tokens"),  # Ollama's own API
            (500, "input (5000 tokens) is too large to process. increase the physical batch size (current batch size: 2048)"),  # llama.cpp
            (500, "input (5000 tokens) is larger than the max context size (4096 tokens). skipping"),  # llama.cpp
        ],
    )
    def test_every_servers_wording_is_context_overflow_asked_once(self, transport, status, refusal):
        """Each server's refusal of a prompt past its window is context_overflow at the first answer: never retried."""
        with ScriptedServer([Reply(status=status, text=refusal)] * 3) as server:
            config = ModelConfig(name="openai/x", api_base=server.url, request_timeout_s=5, retries=2, retry_backoff_s=0, transport=transport)
            with pytest.raises(QualityError) as stop:
                EndpointModel(config).complete([{"role": "user", "content": "hi"}], [])
            assert len(server.requests) == 1
        assert stop.value.reason == "context_overflow"

    @pytest.mark.parametrize("status", [400, 500])
    def test_llamas_error_type_for_a_full_window_is_context_overflow_whatever_its_wording(self, transport, status):
        """llama.cpp's exceed_context_size_error (with n_prompt_tokens and n_ctx beside it) names a prompt past the
        window by its type: context_overflow at the first answer, never retried, however the message is worded."""
        refusal = Reply(status=status, text="prompt of 5000 tokens does not fit in 4096", error_type="exceed_context_size_error",
                        error_fields=(("n_prompt_tokens", 5000), ("n_ctx", 4096)))
        with ScriptedServer([refusal] * 3) as server:
            config = ModelConfig(name="openai/x", api_base=server.url, request_timeout_s=5, retries=2, retry_backoff_s=0, transport=transport)
            with pytest.raises(QualityError) as stop:
                EndpointModel(config).complete([{"role": "user", "content": "hi"}], [])
            assert len(server.requests) == 1
        assert stop.value.reason == "context_overflow"
        assert "does not fit" in stop.value.evidence

    @pytest.mark.parametrize(
        "outage",
        [
            "upstream busy: request too large to process right now, try again later",
            "<html><body><h1>500 Internal Server Error</h1><p>The request is too large to process.</p></body></html>",
            "worker crashed: batch larger than the max context size of the pool",
            "Context size has been exceeded.",
        ],
        ids=["a-proxys-words", "an-html-error-page", "another-servers-words", "llamas-full-kv-cache"],
    )
    def test_another_servers_500_that_a_request_was_too_large_is_retried(self, transport, outage):
        """llama.cpp's two 500s for a prompt that cannot fit begin "input (N tokens) is": a proxy's or another
        server's 500 in like words (a passing outage) is retried, never context_overflow throwing the iteration
        away with a note to read less. So is llama.cpp's "Context size has been exceeded.": its KV cache, shared by
        the requests it serves at once, is full, and every request decoded beside them gets it, however short."""
        with ScriptedServer([Reply(status=500, text=outage), say("back up")]) as server:
            config = ModelConfig(name="openai/x", api_base=server.url, request_timeout_s=5, retries=1, retry_backoff_s=0, transport=transport)
            response = EndpointModel(config).complete([{"role": "user", "content": "hi"}], [])
        assert response.text == "back up"

    @pytest.mark.parametrize(
        "written",
        [
            "a note on the context window and the maximum model length",
            "docs: the server says context shift is disabled when the maximum context length is reached",
        ],
    )
    def test_a_parse_failure_quoting_the_models_words_about_windows_is_retried(self, transport, written):
        """llama.cpp's 500 for output its parser cannot read quotes the model's output: a file the model wrote about
        context windows makes it no refusal of the prompt. It is retried (the next answer may parse), not
        context_overflow throwing the iteration away."""
        echo = f'Failed to parse input at pos 12: <tool_call>{{"name": "write_file", "arguments": {{"content": "{written}"}}}}'
        with ScriptedServer([Reply(status=500, text=echo), say("parsed this time")]) as server:
            config = ModelConfig(name="openai/x", api_base=server.url, request_timeout_s=5, retries=1, retry_backoff_s=0, transport=transport)
            response = EndpointModel(config).complete([{"role": "user", "content": "hi"}], [])
        assert response.text == "parsed this time"

    @pytest.mark.parametrize(
        ("window", "prompt_tokens"),
        [(None, 900), (8192, 900), (4096, 5000)],
        ids=["window-unknown", "window-far-from-full", "window-known-smaller-than-the-servers"],
    )
    def test_an_answer_cut_short_by_the_servers_own_cap_is_the_models(self, transport, window, prompt_tokens):
        """llama.cpp started with `-n 40` (or vLLM's generation_config, a proxy's output limit) ends an answer with
        "length" after 40 of the 2048 tokens asked while the window has room: the model's cut answer, handed back
        as before, never context_overflow (which threw the iteration away with a note to read less)."""
        cut = call("edit_file", '{"path": "a.py", "old": ', finish_reason="length", prompt_tokens=prompt_tokens, completion_tokens=40)
        with ScriptedServer([cut]) as server:
            config = ModelConfig(name="openai/x", api_base=server.url, request_timeout_s=5, retries=0, transport=transport,
                                 context_window=window, max_tokens=2048)
            response = EndpointModel(config).complete([{"role": "user", "content": "hi"}], [])
        assert (response.finish_reason, response.completion_tokens) == ("length", 40)

    @pytest.mark.parametrize("prompt_tokens", [4056, 4050])
    def test_an_answer_that_fills_the_known_window_is_context_overflow(self, transport, prompt_tokens):
        """Prompt and answer, as the server counted them, reaching the 4096-token window (or a few tokens short:
        a server stops a token early) with fewer tokens than asked: the window was full. Its tokens still count."""
        cut = call("edit_file", '{"path": "a.py", "old": ', finish_reason="length", prompt_tokens=prompt_tokens, completion_tokens=40)
        with ScriptedServer([cut]) as server:
            config = ModelConfig(name="openai/x", api_base=server.url, request_timeout_s=5, retries=0, transport=transport,
                                 context_window=4096, max_tokens=1024)
            with pytest.raises(QualityError) as stop:
                EndpointModel(config).complete([{"role": "user", "content": "hi"}], [])
        assert stop.value.reason == "context_overflow"
        assert stop.value.tokens == prompt_tokens + 40
        assert f"after 40 of the 1024 tokens asked (finish_reason=length) with {prompt_tokens} tokens of prompt" in stop.value.evidence

    def test_a_length_cut_without_the_servers_counts_claims_nothing(self, transport):
        """A stream with no usage (a server ignoring stream_options) leaves only estimates: the answer is the model's."""
        body = _sse('{"choices": [{"delta": {"content": "half an answ"}, "finish_reason": "length"}]}')
        raw = _RawServer(body)
        model = EndpointModel(ModelConfig(name="openai/x", api_base=raw.url, request_timeout_s=5, retries=0, transport=transport,
                                          context_window=8, max_tokens=2048))
        try:
            response = model.complete([{"role": "user", "content": "a prompt longer than eight tokens " * 4}], [])
        finally:
            model.close()
            raw.close()
        assert response.finish_reason == "length"


class TestPromptCutByServer:
    PROSE = "the model reads a file and writes a patch for it, "  # about 4.5 characters a token, no runs of one character

    @staticmethod
    def _cut_logged(transport: str, counted: list[int], prompt: str, window: int | None = None) -> list[dict[str, Any]]:
        """The prompt_cut_by_server events of requests of `prompt` the server counted as `counted`."""
        import structlog

        messages = [{"role": "user", "content": prompt}]
        with ScriptedServer([say("done", prompt_tokens=n) for n in counted]) as server, structlog.testing.capture_logs() as logs:
            model = EndpointModel(ModelConfig(name="openai/x", api_base=server.url, request_timeout_s=5, retries=0,
                                              transport=transport, context_window=window))
            answers = [model.complete(messages, []) for _ in counted]
            model.close()
        assert [a.text for a in answers] == ["done"] * len(counted)  # a warning: the answers stand
        return [entry for entry in logs if entry["event"] == "prompt_cut_by_server"]

    def test_a_prompt_past_the_known_window_counted_within_it_is_told_once(self, transport):
        """Ollama's /v1 drops a long prompt's front without a word: 36000 characters sent (at least 6000 tokens at
        six characters a token) past the 4096-token window, and 4000 counted, is logged as prompt_cut_by_server (a
        warning, once a night), and the answers are handed back as they are."""
        prompt = (self.PROSE * 800)[:36000]
        (told,) = self._cut_logged(transport, [4000, 4000], prompt, window=4096)
        assert (told["counted"], told["estimated"], told["window"], told["log_level"]) == (4000, 6000, 4096, "warning")
        assert "within the 4096-token context window" in told["evidence"]

    @pytest.mark.parametrize(
        ("counted", "prompt", "window"),
        [
            ([6200, 350], PROSE * 500, None),
            ([6200, 350], PROSE * 500, 32768),
            ([7800], PROSE * 720, 8192),
            ([3000], ("x = 1" + " " * 60 + "\n") * 600, 4096),
            ([7000], PROSE * 500, 4096),
            ([100], PROSE * 40, 64),
        ],
        ids=["only-the-uncached-part-counted", "only-the-uncached-part-counted-window-known",
             "prose-past-the-window-by-four-characters-a-token-that-fits", "runs-of-spaces-packed-many-to-a-token",
             "counted-past-the-known-window", "a-small-prompt"],
    )
    def test_a_prompt_that_fits_the_window_claims_nothing(self, transport, counted, prompt, window):
        """No cut is claimed of a prompt that may fit the window: a server counting only the part it had not cached
        (Ollama 0.1.x and 0.30: 350 new tokens of a 6000-token conversation from its second request on), prose that
        four characters a token puts past the window while it fits (four to five a token), indentation a tokenizer
        packs many spaces to a token, a count past the window, a small prompt."""
        assert self._cut_logged(transport, counted, prompt, window=window) == []

    def test_the_tasks_of_a_night_tell_it_once_between_them(self, transport):
        """Each task of a night has its own model (for_task); the cut is still told once a night, not once a task."""
        import structlog

        messages = [{"role": "user", "content": (self.PROSE * 800)[:36000]}]
        with ScriptedServer([say("done", prompt_tokens=4000) for _ in range(3)]) as server, structlog.testing.capture_logs() as logs:
            night_model = EndpointModel(ModelConfig(name="openai/x", api_base=server.url, request_timeout_s=5, retries=0,
                                                    transport=transport, context_window=4096), cancel=CancelToken())
            night_model.context_window()
            tasks = [night_model.for_task(CancelToken()) for _ in range(3)]
            assert [task.complete(messages, []).text for task in tasks] == ["done"] * 3
            for task in tasks:
                task.close()
            night_model.close()
        assert len([entry for entry in logs if entry["event"] == "prompt_cut_by_server"]) == 1


class TestTransportChoice:
    @pytest.mark.parametrize(
        ("name", "api_base", "transport", "direct"),
        [
            ("openai/qwen2.5-coder", "http://127.0.0.1:8080/v1", "auto", True),
            ("ollama_chat/qwen2.5-coder", "http://127.0.0.1:11434", "auto", False),
            ("openai/gpt-4o", None, "auto", False),
            ("openai/qwen2.5-coder", "http://127.0.0.1:8080/v1", "litellm", False),
            ("qwen2.5-coder", "http://127.0.0.1:8080/v1", "direct", True),
        ],
    )
    def test_auto_goes_direct_only_for_openai_compatible_servers(self, name, api_base, transport, direct):
        """auto: plain HTTP for "openai/<name>" with an api_base; litellm for every other provider."""
        config = ModelConfig(name=name, api_base=api_base, transport=transport)
        assert uses_direct_http(config) is direct

    def test_auto_leaves_a_proxied_server_to_litellm(self, monkeypatch):
        """http.client ignores HTTP(S)_PROXY; litellm honours it, so auto sends proxied servers through litellm."""
        config = ModelConfig(name="openai/qwen", api_base="http://models.internal:8000/v1")
        monkeypatch.setenv("HTTP_PROXY", "http://proxy.internal:3128")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        assert uses_direct_http(config) is False
        monkeypatch.setenv("NO_PROXY", "models.internal")
        assert uses_direct_http(config) is True

    def test_direct_sends_the_key_as_a_bearer_token_and_reuses_its_connection(self, server):
        """The api key travels in the Authorization header, never in the body; calls share one connection."""
        server.enqueue(say("one"), say("two"))
        config = ModelConfig(name="openai/scripted", api_base=server.url, api_key="sk-test", transport="direct")
        model = EndpointModel(config)
        assert [model.complete(MESSAGES, TOOLS).text for _ in range(2)] == ["one", "two"]
        model.close()
        assert all("api_key" not in body and "sk-test" not in json.dumps(body) for body in server.requests)
        assert server.headers[0]["Authorization"] == "Bearer sk-test"
        assert server.connections_opened == 1

    def test_a_connection_the_server_closed_while_idle_is_replaced_quietly(self, server):
        """Servers close idle kept-alive connections; the next call opens a new one, with no retry counted."""
        server.enqueue(say("one"), say("two"))
        retries: list[tuple[int, str]] = []
        config = ModelConfig(name="openai/scripted", api_base=server.url, transport="direct")
        model = EndpointModel(config, on_retry=lambda n, why: retries.append((n, why)))
        assert model.complete(MESSAGES, TOOLS).text == "one"
        server.drop_connections()
        time.sleep(0.1)
        assert model.complete(MESSAGES, TOOLS).text == "two"
        assert retries == [] and server.connections_opened == 2

    def test_an_api_base_that_is_not_http_is_refused_with_the_config(self):
        with pytest.raises(ValueError, match="not an http"):
            ModelConfig(name="openai/x", api_base="localhost:8080/v1", transport="direct")

    def test_direct_transport_needs_an_api_base(self):
        with pytest.raises(ValueError, match="api_base"):
            ModelConfig(name="qwen2.5-coder", transport="direct")

    def test_an_unknown_transport_is_refused_naming_the_choices(self, tmp_path):
        config = tmp_path / "overnight.toml"
        config.write_text('[model]\nname = "openai/x"\ntransport = "fast"\n[[task]]\nname = "t"\nprompt = "p"\ncheck = "true"\n')
        with pytest.raises(ConfigError, match=r"\[model\] transport: .*'auto', 'litellm' or 'direct'"):
            load_config(config)


class _RawServer(RawServer):
    """Answers every chat request with the same raw body (changed between requests by a test):
    a server that bends the API."""

    def __init__(self, body: bytes, content_type: bytes = b"text/event-stream") -> None:
        self.body = body
        self.content_type = content_type
        super().__init__(self._send_body)

    def _send_body(self, client: socket.socket, head: bytes) -> None:
        client.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
            % (self.content_type, len(self.body)) + self.body
        )


def _answer_from(raw: _RawServer, transport: str = "direct") -> ModelResponse:
    """One request to `raw` through the transport (direct unless told), the model and the server closed after."""
    model = EndpointModel(ModelConfig(name="openai/x", api_base=raw.url, request_timeout_s=5, retries=0, transport=transport))
    try:
        return model.complete([{"role": "user", "content": "hi"}], [])
    finally:
        model.close()
        raw.close()


def _sse(*payloads: str) -> bytes:
    return b"".join(b"data: " + p.encode("utf-8", "surrogateescape") + b"\n\n" for p in payloads) + b"data: [DONE]\n\n"


class TestSloppyServers:
    """Answers that bend the API's types are read for what they mean, never a TypeError in the night."""

    @pytest.mark.parametrize(
        ("body", "text", "call", "tokens"),
        [
            (_sse('{"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "read_file", "arguments": {"path": "a.py"}}}]}}]}'),
             "", ("read_file", '{"path": "a.py"}'), None),
            (_sse('{"choices": [{"delta": {"content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}]}}]}'), "hello", None, None),
            (_sse('{"choices": [{"delta": {"content": [{"type": "text", "text": null}, null, {"type": "text", "text": "hi"}]}}]}'), "hi", None, None),
            (_sse('{"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": 7, "arguments": "{}"}}]}}]}'), "", ("7", "{}"), None),
            (_sse('{"choices": [{"delta": {"content": "x"}}], "usage": {"prompt_tokens": "many", "completion_tokens": NaN}}'), "x", None, (0, 0)),
            (_sse('{"choices": [{"delta": {"content": "x"}}], "usage": {"prompt_tokens": -3, "completion_tokens": 5}}'), "x", None, (0, 5)),
            (_sse('{"choices": [{"delta": {"content": "caf\udce9"}}]}'), "caf\ufffd", None, None),
        ],
        ids=["arguments-object", "content-parts", "null-content-parts", "name-number", "usage-junk", "usage-negative", "invalid-utf8"],
    )
    def test_bent_types_are_read(self, body, text, call, tokens):
        response = _answer_from(_RawServer(body))
        assert response.text == text
        assert [(c.name, c.arguments) for c in response.tool_calls] == ([call] if call else [])
        if tokens is not None:
            # Junk counts are ignored: the prompt is then estimated, the answer counted from the server if it can be.
            assert response.prompt_tokens > 0 and (tokens[1] == 0 or response.completion_tokens == tokens[1])

    def test_a_server_that_does_not_stream_is_read_whole(self):
        """Asked for a stream, a server that answers the whole JSON response is read as one chunk,
        not as an empty answer (which would have been blamed on the model as empty_response)."""
        whole = {
            "choices": [{
                "message": {"role": "assistant", "content": "reading", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}]},
                "finish_reason": "tool_calls",
            }],
            "usage": {"prompt_tokens": 12, "completion_tokens": 7},
        }
        response = _answer_from(_RawServer(json.dumps(whole).encode(), content_type=b"application/json; charset=utf-8"))
        assert response.text == "reading" and response.finish_reason == "tool_calls"
        assert [(c.name, c.arguments, c.id) for c in response.tool_calls] == [("read_file", '{"path": "a.py"}', "c1")]
        assert (response.prompt_tokens, response.completion_tokens) == (12, 7)


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 4 or roll < 0.3:
        return rng.choice(["", "x", "read_file", '{"path": "a"}', 0, -1, 1.5, None, True, [], {}, "\ud83d", 10**20])
    if roll < 0.6:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    keys = ["choices", "delta", "message", "content", "tool_calls", "function", "name", "arguments", "index", "id",
            "usage", "prompt_tokens", "completion_tokens", "finish_reason", "reasoning_content", "error", "text"]
    return {rng.choice(keys): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def _random_body(rng: random.Random) -> bytes:
    parts = []
    for _ in range(rng.randint(0, 6)):
        roll = rng.random()
        if roll < 0.5:
            field = rng.choice(["content", "tool_calls", "reasoning_content"])
            chunk = {"choices": [{"delta": {field: _random_value(rng, 1)}, "finish_reason": rng.choice([None, "stop", 3])}]}
            parts.append(b"data: " + json.dumps(chunk).encode("utf-8", "surrogatepass") + b"\n\n")
        elif roll < 0.8:
            parts.append(b"data: " + json.dumps(_random_value(rng)).encode("utf-8", "surrogatepass") + b"\n\n")
        elif roll < 0.9:
            parts.append(bytes(rng.randrange(256) for _ in range(rng.randint(0, 30))))
        else:
            parts.append(rng.choice([b": ping\n\n", b"event: x\n", b'error: {"message": "e"}\n\n', b"data: [DONE]\n\n", b"\r\n"]))
    return b"".join(parts)


@pytest.mark.parametrize("seed", range(3))
def test_random_answers_end_as_an_answer_or_a_known_failure(seed):
    """Whatever bytes come back with status 200, the client gives an answer that encodes as UTF-8, a
    QualityError, ModelUnreachable (bytes that are not JSON among them: retries spent), or "model
    request rejected" (an error event with a status that means a bad request); never a TypeError of
    its own."""
    rng = random.Random(seed)
    raw = _RawServer(b"")
    model = EndpointModel(ModelConfig(name="openai/x", api_base=raw.url, request_timeout_s=2, retries=0, transport="direct"))
    try:
        for _ in range(60):
            raw.body = _random_body(rng)
            raw.content_type = rng.choice([b"text/event-stream", b"application/json"])
            try:
                response = model.complete([{"role": "user", "content": "hi"}], [])
            except (QualityError, ModelUnreachable):
                continue
            except RuntimeError as rejected:
                assert "model request rejected" in str(rejected)
                continue
            (response.text + response.reasoning + "".join(c.name + c.arguments for c in response.tool_calls)).encode("utf-8")
            assert response.prompt_tokens >= 0 and response.completion_tokens >= 0
    finally:
        model.close()
        raw.close()


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"[" * 100000, b"application/json"),
        (b"error: " + b"[" * 100000 + b"\n\n", b"text/event-stream"),
        (b'error: {"error": ' + b"[" * 100000 + b"\n\n", b"text/event-stream"),
        (b'data: {"error": ' + b"[" * 100000 + b"}\n\n", b"text/event-stream"),
    ],
    ids=["a-json-body", "an-error-line", "an-error-line-with-an-object", "an-event"],
)
def test_json_nested_past_pythons_limit_is_garbage_not_a_recursion_error(transport, body, content_type):
    """JSON nested deeper than Python's recursion limit ("[[[[...", a broken server's garbage) made json.loads raise
    RecursionError through the client (a traceback where an answer or an error message was): it is a known failure,
    as any other body that is not JSON."""
    if transport == "litellm" and body.startswith(b"error:"):
        pytest.skip("the openai SDK reads no llama-server `error:` line (no SSE field)")
    raw = _RawServer(body, content_type)
    with pytest.raises((ModelUnreachable, RuntimeError)) as caught:
        _answer_from(raw, transport)
    assert not isinstance(caught.value, RecursionError)
    assert "not JSON" in str(caught.value) or "model request rejected" in str(caught.value)


class TestServerAnswerTime:
    def test_a_name_that_does_not_resolve_is_no_answer(self) -> None:
        """A host name no resolver knows answered nothing: inf, not the milliseconds its failed lookup took."""
        from orchestrator.server_probes import server_answer_time

        assert server_answer_time("http://no-such-host.invalid:8000/v1", 2) == math.inf

    @pytest.mark.parametrize("no_route", [errno.EHOSTUNREACH, errno.ENETUNREACH])
    def test_no_route_to_the_server_is_no_answer(self, monkeypatch, no_route) -> None:
        """No route to the server's host or network (a machine switched off, a VPN down) is no answer either: inf."""
        from orchestrator.server_probes import server_answer_time

        def unreachable(*args: Any, **kwargs: Any) -> socket.socket:
            raise OSError(no_route, os.strerror(no_route))

        monkeypatch.setattr(socket, "create_connection", unreachable)
        assert server_answer_time("http://127.0.0.1:8000/v1", 2) == math.inf


class TestServedContextWindow:
    def test_ollama_says_num_ctx_when_the_model_sets_it(self) -> None:
        """Ollama's own API (`ollama_chat/`): the window is the model's num_ctx parameter, asked of /api/show."""
        from orchestrator.fake_server import ScriptedServer
        from orchestrator.server_probes import served_context_window

        with ScriptedServer() as server:
            root = f"http://127.0.0.1:{server.port}"
            assert served_context_window(root, "ollama_chat/qwen2.5-coder:7b", None, 5) is None
            server.show = {"parameters": 'num_ctx                        8192\nstop                           "<|im_end|>"', "model_info": {"qwen2.context_length": 32768}}
            assert served_context_window(root, "ollama_chat/qwen2.5-coder:7b", None, 5) == (8192, "Ollama's /api/show (num_ctx)")
            # Without num_ctx the window is Ollama's default, which depends on its version: not guessed.
            server.show = {"parameters": 'stop "<|im_end|>"', "model_info": {"qwen2.context_length": 32768}}
            assert served_context_window(root, "ollama/qwen2.5-coder:7b", None, 5) is None
            assert server.other_requests == ["/api/show"] * 3

    def test_vllm_names_the_model_among_several_and_the_key_goes_along(self) -> None:
        from orchestrator.fake_server import ScriptedServer
        from orchestrator.server_probes import served_context_window

        with ScriptedServer() as server:
            server.model_fields = {"max_model_len": 16384}
            assert served_context_window(server.url, "hosted_vllm/scripted", "k-123", 5) == (16384, "vLLM's /v1/models (max_model_len)")
            assert served_context_window(server.url, "openai/other", None, 5) == (16384, "vLLM's /v1/models (max_model_len)")  # the only one
            server.props = {"default_generation_settings": {"n_ctx": True}}  # not a number: not believed
            assert served_context_window(server.url, "openai/scripted", None, 5) == (16384, "vLLM's /v1/models (max_model_len)")

    @pytest.mark.parametrize("nonsense", [10**400, 1_000_000_001])
    def test_a_window_no_config_could_hold_is_not_reported(self, nonsense) -> None:
        """A window past [model] context_window's ceiling is taken as not reported: llama.cpp's answer is passed over
        for vLLM's, as when it says nothing."""
        from orchestrator.fake_server import ScriptedServer
        from orchestrator.server_probes import served_context_window

        with ScriptedServer() as server:
            server.props = {"default_generation_settings": {"n_ctx": nonsense}}
            server.model_fields = {"max_model_len": 8192}
            assert served_context_window(server.url, "openai/scripted", None, 5) == (8192, "vLLM's /v1/models (max_model_len)")
            server.model_fields = {"max_model_len": nonsense}
            assert served_context_window(server.url, "openai/scripted", None, 5) is None

    @pytest.mark.parametrize("digits", ["9" * 5000, "9" * 400, "1000000001"])
    def test_an_ollama_num_ctx_no_config_could_hold_is_not_reported(self, digits) -> None:
        """Ollama's num_ctx past the ceiling is not reported; one of 4300 digits or more raised ValueError from int()."""
        from orchestrator.fake_server import ScriptedServer
        from orchestrator.server_probes import served_context_window

        with ScriptedServer() as server:
            server.show = {"parameters": f"num_ctx    {digits}\n"}
            assert served_context_window(f"http://127.0.0.1:{server.port}", "ollama_chat/qwen", None, 5) is None
            server.show = {"parameters": "num_ctx    1000000000\n"}  # the ceiling itself is a window
            assert served_context_window(f"http://127.0.0.1:{server.port}", "ollama_chat/qwen", None, 5) == (
                1_000_000_000, "Ollama's /api/show (num_ctx)"
            )

    def test_no_server_and_a_proxy_are_nothing_known(self, monkeypatch) -> None:
        from orchestrator.server_probes import served_context_window

        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            closed = f"http://127.0.0.1:{free.getsockname()[1]}/v1"
        assert served_context_window(closed, "openai/x", None, 2) is None
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        assert served_context_window("http://10.1.2.3:8000/v1", "openai/x", None, 2) is None
