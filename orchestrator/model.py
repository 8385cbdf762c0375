"""The one real `Model`: an endpoint reached through a transport, streamed and watched.

Three things happen here and nowhere else: retries (an endpoint that is down
or overloaded is retried with backoff, then reported as `ModelUnreachable`),
the silence watchdog (`QualityError("watchdog_timeout")`), and the runaway
cut-off (`QualityError("runaway_output")`). How the request travels (litellm,
or plain OpenAI-compatible HTTP) is orchestrator/transport_choice.py; neither
transport retries on its own, so retries never nest.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable, Sequence

from orchestrator.errors import ModelUnreachable, QualityError
from orchestrator.records import ModelResponse, RawToolCall
from orchestrator.secrecy import Redactor, shown_url
from orchestrator.surrogates import mend
from orchestrator.tokens import estimate_prompt_tokens, estimate_tokens
from orchestrator import server_probes, transport_choice, transports
from orchestrator.litellm_transport import litellm_module

if TYPE_CHECKING:  # pydantic is not needed to import this module
    from orchestrator.config import ModelConfig

Message = dict[str, Any]

# Runaway repetition: the last REPEAT_WINDOW characters are one unit of at most
# REPEAT_MAX_UNIT characters over and over. Checked every REPEAT_CHECK_EVERY
# new characters so a long stream costs little.
REPEAT_WINDOW = 512
# A file being written may repeat a short unit for a while (an empty board in a test fixture, a
# table of zeros, a rule line): in a call's arguments, and in text once a written call has begun
# in it, a loop must fill this much (max_output_chars still caps the whole).
WRITTEN_REPEAT_WINDOW = 4096
# What begins a call written in the text (orchestrator/written_calls.py reads these forms).
_WRITTEN_CALL_OPENINGS = ("<tool_call>", "<function=", "[TOOL_CALLS]", '"arguments"', '"parameters"', "[ARGS]")
_LONGEST_OPENING = max(map(len, _WRITTEN_CALL_OPENINGS))
REPEAT_MAX_UNIT = 64
REPEAT_CHECK_EVERY = 32
# The longest wait between two attempts (unless retry_backoff_s itself is longer).
MAX_BACKOFF_S = 300.0
# The least max_tokens a request asks for when a small window scales it down.
ANSWER_FLOOR = 256
# Statuses that mean "the endpoint is busy or broken right now": try again.
_RETRY_STATUSES = frozenset({408, 409, 425, 429}) | frozenset(range(500, 600))
# Statuses that mean "the configuration is wrong": retrying cannot help.
_CONFIG_STATUSES = frozenset({401, 402, 403, 404, 407})

WATCHDOG_CORRECTION = (
    "The model went silent for too long. Keep each reply short and make one tool call at a time."
)
RUNAWAY_CORRECTION = (
    "The reply ran away (far too long, or repeating itself). Keep replies short, "
    "make one tool call at a time, and stop once the call is written."
)

CONTEXT_OVERFLOW_CORRECTION = (
    "The conversation grew past the model's context window. Read less at once (search, or read one file), "
    "make one small change, run the check and submit in fewer turns."
)

# How often a waiting caller looks at the cancel token (and, under litellm, at the stream's silence).
_CANCEL_POLL_S = 0.1
# How long a server silent for request_timeout_s has to answer a GET / before its silence is its own.
# Long enough for a busy server whose request threads are all taken to free one.
_PROBE_S = 30.0
# How long a night's start waits for each of the server's answers about the context window it serves.
_WINDOW_ASK_S = 5.0
# A live server answers a GET from another thread at once; one slower than this was stalled too.
_PROMPT_ANSWER_S = 2.0
# How long a watched reader has to end once its stream was found silent and cut.
_CUT_GRACE_S = 1.0


class EndpointModel:
    """Answers from a model server, streaming by default.

    `config.name` is litellm's model name. For an OpenAI-compatible server
    (llama-server, vLLM, LM Studio, Ollama's /v1) set `api_base` and write the
    name as "openai/<served-model-name>"; `[model] transport` decides whether
    the request goes through litellm or straight over HTTP (see transport_choice.py).

    Raises `QualityError` for silence longer than `config.request_timeout_s`
    (watchdog_timeout), output past `max_output_chars` or looping
    (runaway_output), or a prompt past the context window (context_overflow);
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
        self.max_output_chars = max_output_chars
        self.stream = stream
        # How the wait between attempts passes (tests record it); by default on the cancel token.
        self._sleep = sleep
        self._on_retry = on_retry
        self._transport: Any = None
        self._window: int | None = None  # the context window, asked once (_answer_limit)
        self._asked_server = False
        self._transport_lock = threading.Lock()
        # A server's error may quote the request (the URL with api_base's token, the Authorization
        # header): the message goes into logs, the run store, the exit's error line and notes.md,
        # which the next prompt carries. Those values read *** there, as in a tool's output.
        self._redact = Redactor.for_night(api_key=config.api_key, api_base=config.api_base)
        if cancel is not None:
            cancel.on_cancel(self._interrupt)

    def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> ModelResponse:
        failures = 0
        while True:
            try:
                return self._attempt_or_server_silent(messages, tools)
            except _Retryable as failure:
                failures += 1
                if failures > self.config.retries:
                    raise ModelUnreachable(
                        f"model endpoint {self._where()} failed {failures} times; last error: {failure.reason}"
                    ) from None
                if self._on_retry is not None:
                    self._on_retry(failures, failure.reason)
                self._wait_before_retry(self._backoff(failures, failure.retry_after))

    def _attempt_or_server_silent(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> ModelResponse:
        """One attempt; silence is the model's only while its server answers a `GET /` beside it at once.

        A server stopped, wedged or stalled takes connections (the kernel does) and answers late
        or never: its silence was blamed on the model as watchdog_timeout, with a note telling the
        next attempt to write less, and the task parked. It is retried as any outage is.
        """
        try:
            return self._attempt_until_cancelled(messages, tools)
        except QualityError as stop:
            if stop.reason != "watchdog_timeout":
                raise
            if self._cancel is not None:
                self._cancel.raise_if_cancelled()
            probe_s = min(_PROBE_S, self.config.request_timeout_s)
            took = server_probes.server_answer_time(self.config.api_base, probe_s)
            if self._cancel is not None:
                self._cancel.raise_if_cancelled()  # a SIGTERM during the probe ends the iteration as cancelled
            if took is None or took <= _PROMPT_ANSWER_S:
                raise
            silent = f"no output for {self.config.request_timeout_s:g} s, and the server"
            if took == math.inf:
                raise _Retryable(f"{silent} answered no GET / in {probe_s:g} s (stopped, wedged or gone)") from None
            raise _Retryable(f"{silent} took {took:.1f} s to answer a GET / (stalled or overloaded)") from None

    def _wait_before_retry(self, seconds: float) -> None:
        """Wait out a backoff. A cancel (SIGTERM, the deadline) ends the wait at once: a night
        told to stop must not sit out up to MAX_BACKOFF_S first."""
        if self._sleep is not None:
            self._sleep(seconds)
        elif self._cancel is not None:
            self._cancel.wait(seconds)
        else:
            time.sleep(seconds)
        if self._cancel is not None:
            self._cancel.raise_if_cancelled()

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
            served = server_probes.served_context_window(
                self.config.api_base, self.config.name, self.config.api_key, min(_WINDOW_ASK_S, self.config.request_timeout_s)
            )
            if served is not None:
                self._window = served[0]
                from orchestrator.logs import get_logger

                get_logger().info("context_window_served", window=served[0], said_by=served[1])
        return self._window or None

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # -- one request ---------------------------------------------------------

    def _attempt_until_cancelled(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> ModelResponse:
        """One attempt that a cancel can cut short, even while the server is silent.

        The direct transport is interrupted in place (the cancel shuts its sockets), and
        its stream shows every read, so silence is judged in this thread. litellm's runs
        in a helper thread, watched from this one (`_attempt_watched`).
        """
        try:
            transport = self._get_transport()
        except transports.TransportError as failure:  # an api_base no transport can use
            raise self._decide(failure) from None
        if self._cancel is not None:
            self._cancel.raise_if_cancelled()
        if hasattr(transport, "interrupt"):
            return self._attempt(transport, messages, tools)
        return self._attempt_watched(transport, messages, tools)

    def _attempt_watched(self, transport: Any, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> ModelResponse:
        """litellm's attempt in a helper thread, watched for a cancel and for silence.

        Under litellm the reader hears only whole chunks: a proxy's keep-alive comments
        reach the socket, reset its read timeout and are dropped, so a server that sends
        them for ever was never silent. The watcher judges silence by the time since the
        last chunk and cuts the stream's socket. On a cancel, or a stream it cannot cut,
        the helper thread is abandoned (a daemon; it ends at its read timeout).
        """
        watch = _Watch()
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def attempt() -> None:
            try:
                outcome["response"] = self._attempt(transport, messages, tools, watch)
            except BaseException as exc:  # handed to the caller's thread below
                outcome["error"] = exc
            finally:
                done.set()

        threading.Thread(target=attempt, name="model-call", daemon=True).start()
        while not done.wait(_CANCEL_POLL_S):
            if self._cancel is not None and self._cancel.cancelled:
                watch.cut()
                self._cancel.raise_if_cancelled()
            verdict = self._watch_verdict(watch)
            # A cut stream's reader raises the verdict itself, with the tokens it used; one that could
            # not be cut has _CUT_GRACE_S to end on its own (its read timeout), then is abandoned.
            if verdict is not None and not done.wait(_CUT_GRACE_S):
                raise verdict
        if "error" in outcome:
            raise outcome["error"]
        return outcome["response"]

    def _watch_verdict(self, watch: "_Watch") -> QualityError | None:
        """What stops the watched stream, cutting it: nothing said for request_timeout_s (watchdog_timeout),
        or more bytes since the last chunk than one event could need (runaway_output, one line without end)."""
        if watch.stream is None or watch.verdict is not None:
            return None
        limit = self.config.request_timeout_s
        event_limit = transports.event_byte_limit(self.max_output_chars)
        if time.monotonic() - watch.last_said > limit:
            verdict = _watchdog(limit)
        elif watch.bytes_since_chunk() > event_limit:
            verdict = _runaway(f"one event passed {event_limit} bytes without ending")
        else:
            return None
        # Set before the cut: the reader it wakes may run on before this thread does.
        watch.verdict = verdict
        if not watch.cut():
            watch.verdict = None  # no cut, no reader woken early: the verdict is raised here after the grace
        return verdict

    def _attempt(
        self, transport: Any, messages: Sequence[Message], tools: Sequence[dict[str, Any]], watch: "_Watch | None" = None
    ) -> ModelResponse:
        started, cpu_started = time.monotonic(), time.thread_time()
        draft = _Draft()
        try:
            raw = transport.send(self._request(messages, tools), stream=self.stream)
            if self.stream:
                self._read_stream(raw, draft, watch)
            else:
                draft = _read_whole(raw)
                self._check_runaway(draft)
        except QualityError as stop:  # cut off: what was written so far still cost tokens
            stop.tokens = _tokens_used(draft, messages)
            raise
        except transports.TransportError as failure:
            if self._cancel is not None:
                self._cancel.raise_if_cancelled()  # the failure is the cancel cutting the connection
            decision = self._decide(failure)
            if isinstance(decision, QualityError):  # silence or runaway the transport saw: it cost tokens too
                decision.tokens = _tokens_used(draft, messages)
            raise decision from None
        finally:
            self._count_cpu(time.thread_time() - cpu_started)
        return draft.finish(messages, latency_s=time.monotonic() - started)

    def _interrupt(self) -> None:
        interrupt = getattr(self._transport, "interrupt", None)
        if interrupt is not None:
            interrupt()

    def _count_cpu(self, seconds: float) -> None:
        with self._cpu_lock:
            self.client_cpu_s += seconds

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

    def _read_stream(self, stream: Any, draft: "_Draft", watch: "_Watch | None" = None) -> None:
        """Assemble the stream into `draft`, cutting it on silence or runaway output.

        `watch`, when another thread watches this one, is told of each chunk; when it cut
        the stream (silence, one endless line), what the cut raises here is its verdict.
        """
        limit = self.config.request_timeout_s
        last = time.monotonic()
        said = draft.progress()
        if watch is not None:
            watch.begin(stream, last)
        try:
            for chunk in stream:
                now = time.monotonic()
                # The read timeout bounds each blocking read; this also catches a
                # server that keeps the socket busy without producing output.
                if now - last > limit:
                    raise _watchdog(limit)
                if self._cancel is not None:
                    self._cancel.raise_if_cancelled()
                if chunk is transports.KEEPALIVE:
                    continue
                draft.add_chunk(chunk)
                # An empty delta, sent for ever by a server in a loop, is no more the model speaking
                # than a keep-alive: only a chunk that adds to the answer resets the silence.
                if (progress := draft.progress()) != said:
                    last, said = now, progress
                if watch is not None:
                    watch.last_chunk, watch.last_said = now, last
                self._check_runaway(draft)
        except transports.TransportError:
            if watch is not None and watch.verdict is not None:
                raise watch.verdict from None
            raise
        finally:
            stream.close()
        _check_ended(stream, draft, watch)

    def _check_runaway(self, draft: "_Draft") -> None:
        written = draft.written_chars()
        if written > self.max_output_chars:
            raise _runaway(f"output passed {self.max_output_chars} chars")
        loop = draft.looping_unit()
        if loop is not None:
            unit, window = loop
            raise _runaway(f"output repeats {unit[:40]!r} over its last {window} chars")

    # -- failures ------------------------------------------------------------

    def _decide(self, failure: transports.TransportError) -> Exception:
        """What a transport failure means for the night."""
        message = self._redact(failure.message)
        reason = message[:200]  # cut after the redaction: a cut secret would leave its part
        status = failure.status
        if failure.kind == transports.TIMEOUT:
            return _watchdog(self.config.request_timeout_s)
        if failure.kind == transports.TOO_LONG:
            return _runaway(reason)
        if failure.kind == transports.CONTEXT_FULL:
            return QualityError("context_overflow", CONTEXT_OVERFLOW_CORRECTION, evidence=reason, message="context window exceeded")
        if failure.kind == transports.UNROUTABLE:
            return ModelUnreachable(f"cannot route model {self.config.name!r}: {reason}")
        if failure.kind == transports.WRONG_SERVER:  # a setting to fix: no retry can help
            return ModelUnreachable(f"model endpoint {self._where()} {message}")
        if failure.kind in (transports.CONNECTION, transports.GARBLED) or status in _RETRY_STATUSES:
            return _Retryable(reason, failure.retry_after)
        if status in _CONFIG_STATUSES:
            return ModelUnreachable(f"model endpoint {self._where()} refused the request ({status}): {reason}")
        return RuntimeError(f"model request rejected ({status}): {reason}")

    def _where(self) -> str:
        return f"{shown_url(self.config.api_base)} ({self.config.name})" if self.config.api_base else self.config.name

    def _backoff(self, failures: int, retry_after: float | None = None) -> float:
        # Doubling, but never past MAX_BACKOFF_S a wait: 20 retries would otherwise sleep for weeks.
        ceiling = max(MAX_BACKOFF_S, self.config.retry_backoff_s)
        wait = min(self.config.retry_backoff_s * 2 ** min(failures - 1, 32) * random.uniform(0.75, 1.25), ceiling)
        # A server's Retry-After is the least it will take, within the same ceiling.
        return max(wait, min(retry_after or 0.0, ceiling))


class _Watch:
    """What a thread reading a stream shows the thread watching it: the stream, and when its last chunk came."""

    def __init__(self) -> None:
        self.stream: Any = None
        self.last_chunk = 0.0  # any chunk: the bytes of one event are counted from it
        self.last_said = 0.0  # a chunk that added to the answer: silence is counted from it
        # Set by the watcher when it cut the stream: what the reader raises instead of the cut's error.
        self.verdict: QualityError | None = None
        self._chunk_seen = -1.0
        self._bytes_at_chunk = 0

    def begin(self, stream: Any, now: float) -> None:
        self.last_chunk = self.last_said = now
        self.stream = stream

    def bytes_since_chunk(self) -> int:
        """Bytes read since the last chunk, as of the watcher's last look (the reader does not count them)."""
        read = self.stream.bytes_read() if hasattr(self.stream, "bytes_read") else 0
        if self.last_chunk != self._chunk_seen:
            self._chunk_seen, self._bytes_at_chunk = self.last_chunk, read
        return read - self._bytes_at_chunk

    def cut(self) -> bool:
        """Shut the stream's connection, so a read blocked on it returns; False when it cannot be cut."""
        cut = getattr(self.stream, "cut", None)
        return bool(cut()) if cut is not None else False


class _Retryable(Exception):
    """An attempt failed in a way another attempt may not."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


def _watchdog(limit: float) -> QualityError:
    return QualityError("watchdog_timeout", WATCHDOG_CORRECTION, evidence=f"no output for {limit:g} s")


def _check_ended(stream: Any, draft: "_Draft", watch: "_Watch | None") -> None:
    """A stream that ended is an answer, unless the watcher had cut it or the server closed it mid-answer."""
    if watch is not None and watch.verdict is not None:
        raise watch.verdict
    if not draft.finish_reason and getattr(stream, "ended_by_close", False):
        # A server restarting mid-answer: the half answer (a call's arguments cut short) is not the model's.
        raise transports.TransportError(
            transports.CONNECTION, "the connection closed before the answer ended (no finish_reason, no [DONE])"
        )


def _runaway(evidence: str) -> QualityError:
    return QualityError("runaway_output", RUNAWAY_CORRECTION, evidence=evidence)


def _tokens_used(draft: "_Draft", messages: Sequence[Message]) -> int:
    """What an answer cut off so far cost (0 when nothing was written)."""
    return draft.finish(messages, latency_s=0).tokens if draft.written_chars() else 0


# -- assembling a response ---------------------------------------------------


@dataclass
class _Channel:
    """One growing text (content, reasoning or a call's arguments) and its recent tail."""

    parts: list[str] = field(default_factory=list)
    length: int = 0
    tail: str = ""
    unchecked: int = 0
    # How much of one unit over and over is a loop: WRITTEN_REPEAT_WINDOW for a call's arguments.
    window: int = REPEAT_WINDOW
    # Text, which may come to hold a written call: its window widens once one begins.
    may_hold_calls: bool = False

    def add(self, piece: str) -> None:
        self.parts.append(piece)
        self.length += len(piece)
        if self.may_hold_calls:
            new = self.tail[-_LONGEST_OPENING:] + piece  # an opening may have begun in the piece before
            if any(opening in new for opening in _WRITTEN_CALL_OPENINGS):
                self.may_hold_calls, self.window = False, WRITTEN_REPEAT_WINDOW
        self.tail = (self.tail + piece)[-self.window :]
        self.unchecked += len(piece)

    def looping_unit(self) -> tuple[str, int] | None:
        """The unit the tail repeats, and the window, if the whole window is one unit over and over."""
        if self.unchecked < REPEAT_CHECK_EVERY or len(self.tail) < self.window:
            return None
        self.unchecked = 0
        tail = self.tail
        for unit in range(1, REPEAT_MAX_UNIT + 1):
            if tail[unit:] == tail[:-unit]:
                return tail[:unit], self.window
        return None

    def text(self) -> str:
        return "".join(self.parts)


@dataclass
class _CallDraft:
    id: str = ""
    name: str = ""
    arguments: _Channel = field(default_factory=lambda: _Channel(window=WRITTEN_REPEAT_WINDOW))


@dataclass
class _Draft:
    """A response being put together from stream chunks (or one whole message)."""

    content: _Channel = field(default_factory=lambda: _Channel(may_hold_calls=True))
    reasoning: _Channel = field(default_factory=_Channel)
    calls: dict[int, _CallDraft] = field(default_factory=dict)
    # Deltas without an index: the slot in `calls` that each place in a delta's list now continues.
    unindexed_slots: dict[int, int] = field(default_factory=dict)
    # Indexes a server gave to more than one call (Ollama's /v1 gives every call index 0): the slot each now continues.
    reused_index_slots: dict[int, int] = field(default_factory=dict)
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add_chunk(self, chunk: Any) -> None:
        """A stream chunk; or a whole response, from a server that does not stream (its `message` for the delta)."""
        self.add_usage(getattr(chunk, "usage", None))
        for choice in _list(getattr(chunk, "choices", None)):
            delta = getattr(choice, "delta", None) or getattr(choice, "message", None)
            if delta is not None:
                self.add_message(delta)
            if getattr(choice, "finish_reason", None):
                self.finish_reason = str(choice.finish_reason)

    def add_message(self, message: Any) -> None:
        if getattr(message, "content", None):
            self.content.add(_as_text(message.content))
        # `reasoning` is how Ollama's /v1 and newer vLLM name it.
        reasoning = getattr(message, "reasoning_content", None) or getattr(message, "reasoning", None)
        if reasoning:
            self.reasoning.add(_as_text(reasoning))
        for position, call in enumerate(_list(getattr(message, "tool_calls", None))):
            self._add_call(position, call)

    def _add_call(self, position: int, call: Any) -> None:
        index = getattr(call, "index", None)
        if not isinstance(index, int):
            index = self._unindexed_slot(position, getattr(call, "id", None))
        else:
            index = self._reused_index_slot(index, call)
        draft = self.calls.setdefault(index, _CallDraft())
        if getattr(call, "id", None) and not draft.id:
            draft.id = _as_text(call.id)
        function = getattr(call, "function", None)
        if function is None:
            return
        # Some servers repeat the name in every delta; it is never split.
        if getattr(function, "name", None) and not draft.name:
            draft.name = _as_text(function.name)
        if getattr(function, "arguments", None):
            draft.arguments.add(_arguments_text(function.arguments))

    def _unindexed_slot(self, position: int, call_id: Any) -> int:
        """Where a call delta without an `index` goes: the call last begun at its place in the list, or a
        new one when it carries another id. Servers that send each whole call in a chunk of its own, all
        at place 0, had their calls merged into one ('{"path": "a.py"}{"path": "b.py"}')."""
        slot = self.unindexed_slots.get(position, position)
        current = self.calls.get(slot)
        if call_id and current is not None and current.id and current.id != _as_text(call_id):
            slot = max(self.calls) + 1
            self.unindexed_slots[position] = slot
        return slot

    def _reused_index_slot(self, index: int, call: Any) -> int:
        """Where a call delta with an `index` goes: the call at that index; or a new one when the delta begins
        another call there (another id, and a name). Ollama's /v1 streams each whole call in a chunk of its
        own, every one at index 0: two reads were one call of '{"path": "a.py"}{"path": "b.py"}'."""
        slot = self.reused_index_slots.get(index, index)
        current = self.calls.get(slot)
        call_id, function = getattr(call, "id", None), getattr(call, "function", None)
        # A name too: a server that sent a new id with every piece of one call would otherwise split it.
        begins_a_call = bool(call_id) and bool(getattr(function, "name", None))
        if begins_a_call and current is not None and current.id and current.id != _as_text(call_id):
            slot = max(self.calls) + 1
            self.reused_index_slots[index] = slot
        return slot

    def add_usage(self, usage: Any) -> None:
        if usage is None:
            return
        self.prompt_tokens = _count(getattr(usage, "prompt_tokens", None)) or self.prompt_tokens
        self.completion_tokens = _count(getattr(usage, "completion_tokens", None)) or self.completion_tokens

    def progress(self) -> tuple[int, int, str]:
        """How far the answer has come: changes with every piece of text, reasoning, call or ending."""
        return self.written_chars(), sum(len(c.name) + 1 for c in self.calls.values()), self.finish_reason

    def written_chars(self) -> int:
        # Reasoning is output too: a model thinking on and on runs away as surely as one writing.
        return self.content.length + self.reasoning.length + sum(c.arguments.length for c in self.calls.values())

    def looping_unit(self) -> tuple[str, int] | None:
        for channel in (self.content, self.reasoning, *(c.arguments for c in self.calls.values())):
            unit = channel.looping_unit()
            if unit is not None:
                return unit
        return None

    def finish(self, messages: Sequence[Message], *, latency_s: float) -> ModelResponse:
        from orchestrator.toolcalls import thinking_apart

        # Thinking a server left in the text (no reasoning parser) is reasoning: the guards judge the answer.
        text, thought = thinking_apart(mend(self.content.text()))
        calls = tuple(
            RawToolCall(name=mend(c.name), arguments=mend(c.arguments.text()), id=c.id) for _, c in sorted(self.calls.items())
        )
        reasoning = "\n".join(filter(None, (mend(self.reasoning.text()), thought)))
        written = reasoning + text + "".join(c.name + c.arguments for c in calls)
        return ModelResponse(
            text=text,
            tool_calls=calls,
            prompt_tokens=self.prompt_tokens or estimate_prompt_tokens(messages),
            completion_tokens=self.completion_tokens or estimate_tokens(written),
            latency_s=latency_s,
            finish_reason=self.finish_reason or ("tool_calls" if calls else "stop"),
            reasoning=reasoning,
        )


def _as_text(value: Any) -> str:
    """A field the API says is a string, as one, whatever a server sent: content as a list of
    parts, arguments as an object instead of its JSON text, a number."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_as_text(_part_text(part)) for part in value)
    if isinstance(value, (dict, SimpleNamespace)):
        return _json_text(value)
    return str(value)


def _arguments_text(value: Any) -> str:
    """A call's arguments as JSON text, also when a server sent the object (or an array) itself:
    litellm hands those on as a dict or a list, whose Python repr is not JSON."""
    if isinstance(value, (dict, list, SimpleNamespace)):
        return _json_text(value)
    return _as_text(value)


def _part_text(part: Any) -> Any:
    """The text of one content part: {"type": "text", "text": ...} as a dict (litellm) or a namespace (direct)."""
    return part.get("text", "") if isinstance(part, dict) else getattr(part, "text", part)


def _json_text(value: Any) -> str:
    return json.dumps(value, default=vars, ensure_ascii=False)


def _list(value: Any) -> list[Any]:
    """A field the API says is a list (choices, tool calls), or [] for whatever else a server sent there."""
    if isinstance(value, list):
        return value
    return [value] if isinstance(value, SimpleNamespace) else []


def _count(value: Any) -> int:
    """A token count, or 0 for anything that is not a sane one (a string, null, NaN, below zero)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 2**53:
        return 0
    return int(value)


def _read_whole(response: Any) -> _Draft:
    draft = _Draft()
    draft.add_usage(getattr(response, "usage", None))
    for choice in _list(getattr(response, "choices", None)):
        message = getattr(choice, "message", None)
        if message is not None:
            draft.add_message(message)
        if getattr(choice, "finish_reason", None):
            draft.finish_reason = str(choice.finish_reason)
        break  # one choice asked for, one read
    return draft
