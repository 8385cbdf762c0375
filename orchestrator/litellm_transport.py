"""The litellm transport: `litellm.completion` for any provider it knows, its failures read into a `TransportError`'s kinds."""

from __future__ import annotations

import asyncio
import atexit
import gc
import importlib
import inspect
import json
import os
import re
import sys
import threading
from typing import TYPE_CHECKING, Any, Iterator

from orchestrator.answer_bodies import OneChunk, answers_in_body, http_status
from orchestrator.http_headers import media_type_of, retry_after_seconds
from orchestrator.transports import (
    CONNECTION, CONTEXT_FULL, GARBLED, STATUS, TIMEOUT, UNROUTABLE, TransportError, names_full_window, says_context_full, shut_down,
)

if TYPE_CHECKING:
    from orchestrator.config import ModelConfig

# What ends an SSE body: the openai SDK reads it and does not show it.
_DONE_EVENT = re.compile(rb"(?:^|\n)data: ?\[DONE\]")


class LiteLLMTransport:
    """`litellm.completion` for any provider it knows."""

    # For routes it makes no openai SDK client for us (see `_owns_its_client`), litellm caches its clients for the whole
    # process, so every such transport uses the same ones: they are closed when the last of those open closes, not by one
    # task ending while another's answer still streams on them.
    _open_lock = threading.Lock()
    _open = 0

    def __init__(self, config: ModelConfig) -> None:
        self._litellm = litellm_module()
        self._closed = False
        self._config = config
        # The openai SDK client this transport makes, passes to litellm and closes itself: litellm's process-wide cache,
        # filled without a lock, kept one of the clients made by tasks' first calls at once and left the others' sockets open.
        self._owns_client = _owns_its_client(config, self._litellm)
        self._client: Any = None
        self._client_lock = threading.Lock()
        if not self._owns_client:
            with LiteLLMTransport._open_lock:
                LiteLLMTransport._open += 1
        self._settings: dict[str, Any] = {
            # litellm's own default is 6000 s; this is also the per-read silence limit.
            "timeout": config.request_timeout_s,
            # Retries live in orchestrator/retries.py only; the openai SDK would nest its own.
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
        loop_before = _main_threads_set_loop()
        try:
            client = self._own_client() if self._owns_client else None
            settings = self._settings if client is None else {**self._settings, "client": client}
            raw = litellm.completion(**request, **settings)
        except Exception as exc:
            raise self._translate(exc) from exc
        finally:
            if loop_before is None:
                _close_at_exit_a_loop_made_during_the_call()
        if not stream:
            return raw
        chunks = _provider_chunks(raw)
        whole = self._whole_answer(chunks)
        return whole if whole is not None else _LiteLLMChunks(chunks, self._translate)

    def close(self) -> None:
        """litellm's cached clients that hold connections closed, and taken out of its cache so a later night in this process
        makes new ones: left to the garbage collector at exit, a connection kept alive after an error answer was Python's
        plain `ResourceWarning: unclosed <socket.socket ...>` line after the night's last JSON line. Only by the last
        transport open (see `_open`); held under the lock so no other transport sends on a client being closed.
        A transport that made its own client (`_own_client`) closes that one only."""
        if self._owns_client:
            with self._client_lock:
                client, self._client = self._client, None
            if client is not None:
                client.close()
            return
        with LiteLLMTransport._open_lock:
            if self._closed:
                return
            self._closed = True
            LiteLLMTransport._open -= 1
            if LiteLLMTransport._open == 0:
                self._close_cached_clients()

    def _own_client(self) -> Any:
        """This transport's openai SDK client, made on its first call (its lock held: a task's call asked ahead and its
        own first turn may both be first). A call after `close` makes a fresh one, as litellm's emptied cache did;
        only a later `close` closes it."""
        import openai
        from litellm.llms.openai.common_utils import BaseOpenAILLM

        with self._client_lock:
            if self._client is None:
                self._client = openai.OpenAI(
                    base_url=self._config.api_base,
                    api_key=self._settings["api_key"],
                    timeout=self._config.request_timeout_s,
                    max_retries=0,
                    # The HTTP client litellm would make: its SSL settings (SSL_VERIFY, SSL_CERT_FILE), redirects followed.
                    http_client=BaseOpenAILLM.get_sync_http_client(),
                )
            return self._client

    def _close_cached_clients(self) -> None:
        cache = getattr(self._litellm, "in_memory_llm_clients_cache", None)
        for key, client in list(getattr(cache, "cache_dict", {}).items()):
            close = getattr(client, "close", None)
            # An async client's close is a coroutine, for an event loop this thread does not run; it made no connection here.
            if not callable(close) or inspect.iscoroutinefunction(close):
                continue
            cache.cache_dict.pop(key, None)
            getattr(cache, "ttl_dict", {}).pop(key, None)
            try:
                close()
            except Exception:  # a client another thread still uses, or already closed: the night is over either way
                pass

    def _whole_answer(self, chunks: Any) -> "OneChunk | None":
        """An OpenAI-compatible server's answer to a stream request that is not a stream, read as DirectHTTP reads it.

        The openai SDK looks for events in whatever body comes back; in one JSON
        response (a server that does not stream, or `{"error": ...}` with status 200)
        it finds none, and the answer was empty, blamed on the model.
        """
        response = getattr(chunks, "response", None)  # the openai SDK's stream holds its httpx response
        headers = getattr(response, "headers", None)
        if headers is None:
            return None
        media_type = media_type_of(headers.get("content-type"))
        if media_type in ("", "text/event-stream"):
            return None
        try:
            body = response.read()
        except Exception as exc:
            raise self._translate(exc) from exc
        return OneChunk(answers_in_body(body, response.status_code, media_type))

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
        full = isinstance(exc, litellm.exceptions.ContextWindowExceededError) or names_full_window(getattr(exc, "body", None))
        if full or says_context_full(message):
            return TransportError(CONTEXT_FULL, message, status)
        if isinstance(exc, litellm.exceptions.LiteLLMUnknownProvider) or "LLM Provider NOT provided" in message:
            return TransportError(UNROUTABLE, message, status)
        if status is None and isinstance(exc, openai.APIError) and not isinstance(exc, openai.APIConnectionError):
            # An `error` event in the stream, as DirectHTTP reads one: its code, or a fault of the server's.
            body = exc.body if isinstance(exc.body, dict) else {}
            status = http_status(body.get("code")) or 500
        if status is not None:
            headers = getattr(getattr(exc, "response", None), "headers", None)
            retry_after = retry_after_seconds(headers.get("retry-after")) if headers is not None else None
            return TransportError(STATUS, message, status, retry_after)
        if isinstance(exc, openai.APIConnectionError):
            return TransportError(CONNECTION, message)
        # The SDK reading a cut or mangled event or body; or one nested past Python's recursion limit ("[[[[..."),
        # which json raises as RecursionError (told by its words from one of our own).
        if isinstance(exc, json.JSONDecodeError) or (isinstance(exc, RecursionError) and "JSON" in message):
            return TransportError(GARBLED, f"the server sent something that is not JSON ({message})")
        return exc


def _owns_its_client(config: ModelConfig, litellm: Any) -> bool:
    """Whether litellm sends `config`'s calls through an openai SDK client it would take from us (`client=`): its "openai"
    provider with an `api_base` (litellm/main.py passes `client` on to OpenAIChatCompletion._get_openai_client, which
    uses it as given and neither caches nor closes it). Other providers keep litellm's own clients, and its cache."""
    if not config.api_base:
        return False
    try:
        provider = litellm.get_llm_provider(model=config.name, api_base=config.api_base)[1]
    except Exception:  # unroutable: the call says so, as it did
        return False
    return provider == "openai" and not _base_handler_on()


def _base_handler_on() -> bool:
    # litellm then sends "openai" calls through its own HTTP handler, which takes no openai SDK client. Read as
    # litellm/main.py reads it (only "true" counts): a reading of our own ("1") disagreed and kept the leaking path.
    from litellm.secret_managers.main import get_secret_bool

    return bool(get_secret_bool("EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER"))


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
        shut_down(sock)
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
    if "litellm" not in sys.modules:
        _import_litellm_once()
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


def _import_litellm_once() -> None:
    """litellm's import leaves some 370,000 objects that live as long as the process. The cyclic collector walked them
    all at each full collection (a third of a second or more, holding the GIL: every task waited), several times during
    the import itself and again as the process exited (seconds on a busy host, after a signal too). Imported with the
    collector off, then frozen (`gc.freeze`), they are left be."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        importlib.import_module("litellm")
    finally:
        if collecting:
            gc.enable()
    gc.freeze()


# Python 3.14's `get_event_loop` makes no loop where none is set (and reading the policy is deprecated there).
_GET_EVENT_LOOP_MAKES_ONE = sys.version_info < (3, 14)
# The loops litellm made on the main thread during our calls, closed at exit (see below); one in practice.
_loops_made_during_calls: list[asyncio.AbstractEventLoop] = []


def _main_threads_set_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop set on the main thread, read without `get_event_loop` (which would make one where none is set);
    None on other threads, where `get_event_loop` makes none, and where the policy keeps its loop elsewhere."""
    if not _GET_EVENT_LOOP_MAKES_ONE or threading.current_thread() is not threading.main_thread():
        return None
    return getattr(getattr(asyncio.get_event_loop_policy(), "_local", None), "_loop", None)


def _close_at_exit_a_loop_made_during_the_call() -> None:
    """A loop litellm made on the main thread during our call, kept to be closed at exit.

    litellm times each openai call with a service logger that, from a blocking caller, takes `asyncio.get_event_loop()`:
    on the main thread with none set, that makes one, sets it and never closes it; at exit litellm's cleanup hook sets a
    fresh loop in its place and the first was collected open (`ResourceWarning: unclosed event loop`), so a script that
    calls the transport on its main thread printed that line. (A night's calls run on other threads, where litellm makes
    and closes a loop per call.) Only a loop that was not set before our call is ours to close: one the script set itself
    is the script's, which may still use it in an exit hook of its own. Held here until then, it cannot be collected
    open whichever exit hook runs first; a loop still running or already closed at exit is left alone.
    """
    loop = _main_threads_set_loop()
    if loop is None:
        return
    if not _loops_made_during_calls:
        atexit.register(_close_the_loops_made_during_calls)
    _loops_made_during_calls.append(loop)


def _close_the_loops_made_during_calls() -> None:
    for loop in _loops_made_during_calls:
        if not loop.is_running() and not loop.is_closed():
            loop.close()
    _loops_made_during_calls.clear()
