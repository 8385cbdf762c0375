"""A command's output, read while it runs and kept within bounds: a flood cannot fill memory, and what is
kept is what a small model and notes.md can read (no terminal escapes, a redrawn line as its last drawing)."""

from __future__ import annotations

import re
import threading
from collections import deque
from typing import Callable

_READ_CHUNK = 65536
# ECMA-48 control sequences (CSI: colours, cursor moves; OSC: titles, links) and two-character escapes.
_TERMINAL_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


class OutputCollector(threading.Thread):
    """Drains the pipe, keeping only the first and last bytes so a flood cannot fill memory."""

    def __init__(self, stream, budget_bytes: int) -> None:
        super().__init__(daemon=True)
        self._stream = stream
        self._budget = budget_bytes
        self._head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        self.dropped = 0
        # text() may run while a stray process still writes, if the pipe never closed.
        self._lock = threading.Lock()

    def run(self) -> None:
        try:
            while chunk := self._stream.read1(_READ_CHUNK):
                with self._lock:
                    self._keep(chunk)
        except (OSError, ValueError):
            pass
        finally:
            # Nobody reads the pipe after its end; left to the garbage collector, each command's pipe
            # was a ResourceWarning (a plain line among the JSON logs under PYTHONWARNINGS or -X dev).
            self._stream.close()

    def _keep(self, chunk: bytes) -> None:
        room = self._budget - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self._tail.append(chunk)
        self._tail_size += len(chunk)
        while self._tail_size - len(self._tail[0]) >= self._budget:
            self.dropped += len(self._tail[0])
            self._tail_size -= len(self._tail.popleft())

    def text(self) -> str:
        with self._lock:
            head = bytes(self._head).decode("utf-8", errors="replace")
            tail = b"".join(self._tail).decode("utf-8", errors="replace")
        # Colours and cursor moves (a tool run with FORCE_COLOR, say) are noise to a small model and to notes.md.
        return _as_a_terminal_shows(_TERMINAL_ESCAPE.sub("", head + tail))


def output_of(collector: OutputCollector, max_output_chars: int, redact: Callable[[str], str], *, timed_out_after: float | None) -> str:
    """What the command wrote, redacted and capped to `max_output_chars`, the time-out's note included
    when it ran out of time (after `timed_out_after` seconds)."""
    note = f"[timed out after {timed_out_after:g}s; the command was killed]" if timed_out_after is not None else ""
    room = max(max_output_chars - len(note) - 1, 0) if note else max_output_chars
    # Redacted before the cut: a secret the cut splits would otherwise leave its part on one side.
    output = cap_text(redact(collector.text()), room, already_cut=collector.dropped)
    if timed_out_after is not None:
        output = f"{output}\n{note}" if output else note
    return output


def _as_a_terminal_shows(text: str) -> str:
    """A line redrawn with carriage returns (a progress bar) as its last drawing; CRLF as LF.

    Line by line, in linear time: a regex over a long line without a line break (a minified
    file `cat`), holding the GIL, froze every thread of the night for seconds.
    """
    if "\r" not in text:
        return text
    # The carriage returns at a line's end (CRLF, a last redraw) go, then what the last one left drew over.
    return "\n".join(line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n"))


def cap_text(text: str, max_chars: int, *, already_cut: int = 0) -> str:
    """Keep the head and the tail of `text` within `max_chars`, marking the cut.

    The tail gets the larger share because a failing check says what went wrong last.
    `already_cut` counts what was dropped from the middle before `text` was built.
    """
    if len(text) <= max_chars and not already_cut:
        return text
    marker_room = 40
    keep = max(max_chars - marker_room, 0)
    head = keep // 3
    tail = keep - head
    cut = len(text) - head - tail + already_cut
    return f"{text[:head]}\n[... {cut} chars cut ...]\n{text[len(text) - tail:] if tail else ''}"
