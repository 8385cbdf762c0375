"""The one real `Model`: an endpoint reached through a transport, streamed and watched.

The night needs one object that answers `complete`. Getting a sound answer from a server takes
several jobs, each in a module of its own that `EndpointModel` only composes: retries with backoff
(orchestrator/retries.py; what a failure means is endpoint_failures.py), the silence watchdog
(watchdog.py, `QualityError("watchdog_timeout")`), the runaway cut-off (runaway.py,
`QualityError("runaway_output")`), reading a stream (stream_reading.py) and putting its chunks
together into a response (response_draft.py). How the request travels (litellm, or plain
OpenAI-compatible HTTP) is orchestrator/transport_choice.py.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from orchestrator.endpoint_failures import Retryable, cut_by_full_window, decision_for
from orchestrator.errors import Cancelled, QualityError
from orchestrator.prompt_cut import MIN_TOKENS_MISSING, fewest_prompt_tokens, fewest_prompt_tokens_bound, prompt_cut_evidence
from orchestrator.protocols import Message
from orchestrator.records import ModelResponse
from orchestrator.redactor import Redactor
from orchestrator.response_draft import Draft, read_whole
from orchestrator.retries import Retries
from orchestrator.runaway import check_runaway
from orchestrator.stream_reading import read_stream
from orchestrator import server_probes, transport_choice, transports, watchdog
from orchestrator.litellm_transport import litellm_module

if TYPE_CHECKING:  # pydantic is not needed to import this module
    from orchestrator.config import ModelConfig

# The least max_tokens a request asks for when a small window scales it down.
ANSWER_FLOOR = 256
# How long a night's start waits for each of the server's answers about the context window it serves.
_WINDOW_ASK_S = 5.0


class EndpointModel:
    """Answers from a model server, streaming by default.

    `config.name` is litellm's model name. For an OpenAI-compatible server
    (llama-server, vLLM, LM Studio, Ollama's /v1) set `api_base` and write the
    name as "openai/<served-model-name>"; `[model] transport` decides whether
    the request goes through litellm or straight over HTTP (see transport_choice.py).

    Raises `QualityError` for silence longer than `config.request_timeout_s`
    (watchdog_timeout), output past `max_output_chars` or looping
    (runaway_output), or a prompt past the context window (context_overflow; also an answer
    the server ended at the window's end, endpoint_failures.cut_by_full_window);
    `ModelUnreachable` when the endpoint stays down or the configuration is
    refused (401/403/404); `RuntimeError` when the server rejects the request
    itself (400).
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        max_output_chars: int = 20000,
        stream: bool = True,
        sleep: Callable[[float], None] | None = None,
        on_retry: Callable[[int, str], None] | None = None,
        cancel: Any = None,
    ) -> None:
        self.config = config
        # orchestrator.cancel.CancelToken: checked per chunk and between retries.
        self._cancel = cancel
        # CPU seconds spent in the transport and in reading its answers (the benchmark reports it).
        self.client_cpu_s = 0.0
        self._cpu_lock = threading.Lock()
        # The model whose `client_cpu_s` counts this one's seconds: itself, or the night's for a task's (`for_task`).
        self._cpu_counted_by = self
        self.max_output_chars = max_output_chars
        self.stream = stream
        self._sleep, self._on_retry = sleep, on_retry
        self._retries = Retries(config, sleep=sleep, on_retry=on_retry, cancel=cancel)
        self._transport: Any = None
        self._window: int | None = None  # the context window, asked once (_answer_limit)
        self._asked_server = False
        # Shared with the night's task models (for_task): told once a night, not once a task.
        self._prompt_cut_told = threading.Event()
        self._prompt_cut_lock = threading.Lock()
        self._transport_lock = threading.Lock()
        # A server's error may quote the request's secrets: they read *** there, as in a tool's output.
        self._redact = Redactor.for_night(api_key=config.api_key, api_base=config.api_base)
        if cancel is not None:
            cancel.on_cancel(self._interrupt)

    def for_task(self, cancel: Any) -> EndpointModel:
        """This model for one task: its calls listen to `cancel`, the task's token (a child of the night's), so a lost
        lease cuts the task's call, its silence probe and its retry wait as a signal does. Its transport is its own:
        a cut shuts every socket of one, and another task's call goes on. The context window stays the one the night
        asked the server for, and its CPU seconds count in this model's `client_cpu_s`."""
        task_model = EndpointModel(
            self.config, max_output_chars=self.max_output_chars, stream=self.stream, sleep=self._sleep, on_retry=self._on_retry, cancel=cancel
        )
        task_model._window, task_model._asked_server = self._window, True
        task_model._cpu_counted_by = self._cpu_counted_by
        task_model._prompt_cut_told, task_model._prompt_cut_lock = self._prompt_cut_told, self._prompt_cut_lock
        return task_model

    def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> ModelResponse:
        return self._retries.run(lambda: self._attempt_or_server_silent(messages, tools))

    def _attempt_or_server_silent(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> ModelResponse:
        """One attempt; silence is the model's only while its server answers a `GET /` beside it at once.
        A stalled server's is retried as any outage is."""
        try:
            return self._attempt_until_cancelled(messages, tools)
        except QualityError as stop:
            if stop.reason != "watchdog_timeout":
                raise
            try:
                stall = watchdog.server_stall(self.config, self._cancel)
            except Cancelled as cancelled:  # a signal or the deadline while the server was asked: the silent answer still cost
                cancelled.tokens = stop.tokens
                raise
            if stall is None:
                raise
            raise Retryable(stall) from None

    def context_window(self, ask_server: bool = False) -> int | None:
        """Input tokens the model accepts: litellm's figure when it knows the model, else the config's,
        else (`ask_server`, once: a night's start) what the server says it serves the model with."""
        if self._window is None:
            window = self.config.context_window
            try:
                known = litellm_module().get_model_info(self.config.name).get("max_input_tokens")
                if known:
                    window = int(known)
            except Exception:  # unknown model, odd map entry: fall back, never fail a night over it
                pass
            self._window = window or 0
        if not self._window and ask_server and not self._asked_server:
            self._asked_server = True
            ask_s = min(_WINDOW_ASK_S, self.config.request_timeout_s)
            try:
                served = watchdog.asked_unless_cancelled(
                    lambda: server_probes.served_context_window(self.config.api_base, self.config.name, self.config.api_key, ask_s),
                    self._cancel,
                )
            except Cancelled:  # a signal during start-up: the night begins cancelled, not after a stopped server's timeouts
                served = None
            if served is not None:
                self._window = served[0]
                from orchestrator.logs import get_logger

                get_logger().info("context_window_served", window=served[0], said_by=served[1])
        return self._window or None

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _attempt_until_cancelled(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> ModelResponse:
        """One attempt that a cancel can cut short, even while the server is silent.

        The direct transport is interrupted in place (the cancel shuts its sockets), and
        its stream shows every read, so silence is judged in this thread. litellm's runs
        in a helper thread, watched from this one (`watchdog.run_watched`).
        """
        try:
            transport = self._get_transport()
        except transports.TransportError as failure:  # an api_base no transport can use
            raise decision_for(failure, self.config, self._redact) from None
        if self._cancel is not None:
            self._cancel.raise_if_cancelled()
        if hasattr(transport, "interrupt"):
            return self._attempt(transport, messages, tools)
        return watchdog.run_watched(
            lambda watch: self._attempt(transport, messages, tools, watch),
            silence_limit=self.config.request_timeout_s,
            event_limit=transports.event_byte_limit(self.max_output_chars),
            cancel=self._cancel,
        )

    def _attempt(
        self, transport: Any, messages: Sequence[Message], tools: Sequence[dict[str, Any]], watch: watchdog.Watch | None = None
    ) -> ModelResponse:
        started, cpu_started = time.monotonic(), time.thread_time()
        draft = Draft()
        request = self._request(messages, tools)
        try:
            raw = transport.send(request, stream=self.stream)
            if self.stream:
                read_stream(
                    raw,
                    draft,
                    silence_limit=self.config.request_timeout_s,
                    max_output_chars=self.max_output_chars,
                    cancel=self._cancel,
                    watch=watch,
                )
            else:
                draft = read_whole(raw)
                check_runaway(draft, self.max_output_chars)
        except (QualityError, Cancelled) as stop:  # cut off (a guard, the deadline, a signal): what was written still cost tokens
            stop.tokens = _tokens_used(draft, messages)
            raise
        except transports.TransportError as failure:
            if self._cancel is not None and self._cancel.cancelled:  # the failure is the cancel cutting the connection
                raise Cancelled(self._cancel.why, tokens=_tokens_used(draft, messages)) from None
            decision = decision_for(failure, self.config, self._redact)
            if isinstance(decision, QualityError):  # silence or runaway the transport saw: it cost tokens too
                decision.tokens = _tokens_used(draft, messages)
            raise decision from None
        finally:
            self._count_cpu(time.thread_time() - cpu_started)
        response = draft.finish(messages, latency_s=time.monotonic() - started)
        window_full = (  # the window is looked up only for such an answer: litellm's import takes seconds
            cut_by_full_window(response, draft, request["max_tokens"], self.context_window())
            if response.finish_reason == "length"
            else None
        )
        if window_full is not None:
            window_full.tokens = response.tokens
            raise window_full
        self._warn_if_prompt_cut(draft.prompt_tokens, messages)
        return response

    def _warn_if_prompt_cut(self, counted: int, messages: Sequence[Message]) -> None:
        """Log `prompt_cut_by_server` (once a night: every later request of that conversation is cut alike) when
        the server's count of the prompt says it read less than was sent (prompt_cut)."""
        if self._prompt_cut_told.is_set() or not counted:
            return
        if fewest_prompt_tokens_bound(messages) - counted < MIN_TOKENS_MISSING:  # the usual answer, at little cost
            return
        fewest = fewest_prompt_tokens(messages)
        if fewest - counted < MIN_TOKENS_MISSING:  # the usual answer: the window is not looked up (litellm's import)
            return
        window = self.context_window()
        evidence = prompt_cut_evidence(counted, fewest, window)
        if evidence is None:
            return
        with self._prompt_cut_lock:  # a night's tasks ask at once: the first cut seen is told, the others not
            if self._prompt_cut_told.is_set():
                return
            self._prompt_cut_told.set()
        from orchestrator.logs import get_logger

        get_logger().warning("prompt_cut_by_server", counted=counted, estimated=fewest, window=window, evidence=evidence)

    def _interrupt(self) -> None:
        interrupt = getattr(self._transport, "interrupt", None)
        if interrupt is not None:
            interrupt()

    def _count_cpu(self, seconds: float) -> None:
        counter = self._cpu_counted_by
        with counter._cpu_lock:
            counter.client_cpu_s += seconds

    def _get_transport(self) -> Any:
        # Built on first use: litellm's import takes seconds, and a night that never calls needs neither.
        with self._transport_lock:
            if self._transport is None:
                self._transport = transport_choice.transport_for(self.config, max_output_chars=self.max_output_chars)
                if self._cancel is not None and self._cancel.cancelled:
                    self._interrupt()  # the cancel came while it was being made
            return self._transport

    def _answer_limit(self) -> int:
        """`max_tokens`; left at its default, no more than a quarter of a known context window (at least
        ANSWER_FLOOR): vLLM refuses a request whose prompt and max_tokens together pass the window, and
        2048 is half of a 4096-token one."""
        if "max_tokens" in self.config.model_fields_set:
            return self.config.max_tokens
        self.context_window()
        return min(self.config.max_tokens, max(ANSWER_FLOOR, self._window // 4)) if self._window else self.config.max_tokens

    def _request(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
        config = self.config
        request: dict[str, Any] = {
            "model": config.name,
            "messages": [dict(m) for m in messages],
            "temperature": config.temperature,
            "max_tokens": self._answer_limit(),
        }
        if tools:
            request["tools"] = list(tools)
            request["tool_choice"] = "auto"
        if self.stream:
            request["stream"] = True
            request["stream_options"] = {"include_usage": True}
        return request


def _tokens_used(draft: Draft, messages: Sequence[Message]) -> int:
    """What an answer cut off so far cost (0 when nothing was written)."""
    return draft.finish(messages, latency_s=0).tokens if draft.written_chars() else 0
