"""A streamed answer's Server-Sent Events, read as they arrive: each `data:` payload, keep-alives, `[DONE]`, runaway lines."""

from __future__ import annotations

import http.client
from typing import Any, Iterator

from orchestrator.answer_bodies import answer_of, read_error_body
from orchestrator.transports import CONNECTION, KEEPALIVE, NETWORK_ERRORS, TOO_LONG, TransportError, network_error


class Events:
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
        except NETWORK_ERRORS as exc:
            raise network_error(exc) from exc

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
                    yield answer_of(payload)
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
            return answer_of(payload)
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
        said = read_error_body(text, fallback=text.strip())
        raise TransportError(said.kind, said.message)
    elif not line and data:
        payload = b"\n".join(data).strip()
        data.clear()
        return payload
    return None
