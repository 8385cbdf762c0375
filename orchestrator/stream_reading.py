"""A streamed answer read chunk by chunk into a draft, and stopped as soon as it must be.

Reading and judging go together: each chunk may end the answer (a cancel, silence since the last
chunk that said anything, output past the cap or looping), and an answer that was cut or that
the server's close ended half way must not pass for a whole one.
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator import transports
from orchestrator.response_draft import Draft
from orchestrator.runaway import check_runaway
from orchestrator.watchdog import Watch, watchdog_timeout


def read_stream(
    stream: Any, draft: Draft, *, silence_limit: float, max_output_chars: int, cancel: Any, watch: Watch | None = None
) -> None:
    """Assemble the stream into `draft`, cutting it on silence or runaway output.

    `watch`, when another thread watches this one, is told of each chunk; when it cut
    the stream (silence, one endless line), what the cut raises here is its verdict.
    """
    last = time.monotonic()
    said = draft.progress()
    if watch is not None:
        watch.begin(stream, last)
    try:
        for chunk in stream:
            now = time.monotonic()
            # The read timeout bounds each blocking read; this also catches a
            # server that keeps the socket busy without producing output.
            if now - last > silence_limit:
                raise watchdog_timeout(silence_limit)
            if cancel is not None:
                cancel.raise_if_cancelled()
            if chunk is transports.KEEPALIVE:
                continue
            draft.add_chunk(chunk)
            # An empty delta, sent for ever by a server in a loop, is no more the model speaking
            # than a keep-alive: only a chunk that adds to the answer resets the silence.
            if (progress := draft.progress()) != said:
                last, said = now, progress
            if watch is not None:
                watch.last_chunk, watch.last_said = now, last
            check_runaway(draft, max_output_chars)
    except transports.TransportError:
        if watch is not None and watch.verdict is not None:
            raise watch.verdict from None
        raise
    finally:
        stream.close()
    _check_ended(stream, draft, watch)


def _check_ended(stream: Any, draft: Draft, watch: Watch | None) -> None:
    """A stream that ended is an answer, unless the watcher had cut it or the server closed it mid-answer."""
    if watch is not None and watch.verdict is not None:
        raise watch.verdict
    if not draft.finish_reason and getattr(stream, "ended_by_close", False):
        # A server restarting mid-answer: the half answer (a call's arguments cut short) is not the model's.
        raise transports.TransportError(
            transports.CONNECTION, "the connection closed before the answer ended (no finish_reason, no [DONE])"
        )
