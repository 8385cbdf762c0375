"""How read_file shows a file's text: its lines numbered, cut to fit with a note on how to read on,
checked for UTF-8, or said to be binary."""

from __future__ import annotations

from typing import BinaryIO, Iterator

# How much of a file's start is looked at: a NUL byte there makes it binary (read_file, search), and
# write_file keeps the line ends and byte order mark it finds there.
BINARY_SNIFF_BYTES = 8192


def binary_message(path: str, size: int) -> str:
    return f"{path!r} is a binary file ({size} bytes); it cannot be shown as text"


def whole_lines(text: str) -> str:
    """`text` up to its last line break, if it has one: a line cut in half could not be copied into edit_file."""
    end = text.rfind("\n")
    return text[: end + 1] if end >= 0 else text


def read_on(next_line: int) -> str:
    return f"Read on with read_file and start_line={next_line} (end_line is optional), or use search to find the lines you need."


def numbered_lines(handle: BinaryIO, *, longest: int) -> Iterator[tuple[int, bytes]]:
    """(number from 1, line) for each line of a binary file, lines split at b"\\n" only.

    A line is cut at `longest` bytes and the rest of it skipped, so that a file of
    one huge line is never held in memory whole.
    """
    number = 0
    while line := handle.readline(longest):
        number += 1
        rest = line
        while not rest.endswith(b"\n") and (rest := handle.readline(longest)):
            pass
        yield number, line


def cut_range(shown: list[str], first: int, number: int, line: str, room: int) -> tuple[str, str]:
    """Lines `first` to `number` - 1, and a note on how to read on from line `number`, which did not fit."""
    if shown:
        return "".join(shown), f"[... only lines {first}-{number - 1} fit in the output. {read_on(number)}]"
    return line[:room], f"[... line {number} is too long to show whole; only its first {room} chars are shown. {read_on(number + 1)}]"


def with_note(text: str, *notes: str) -> str:
    """`text` with the notes that are not empty, each on a line of its own after it."""
    lines = [note for note in notes if note]
    if not lines:
        return text
    return text + ("" if text.endswith("\n") else "\n") + "\n".join(lines)


def is_utf8(data: bytes, *, complete: bool) -> bool:
    """Whether `data` is UTF-8; a character cut at the end of an incomplete read is no sign against it."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        return not complete and error.reason == "unexpected end of data"
    return True



def not_utf8_note(path: str) -> str:
    return (
        f"[{path} is not UTF-8 text: its bytes that are not UTF-8 are shown as \ufffd. edit_file keeps them, "
        "but cannot match them: choose an `old` without them. write_file would lose them.]"
    )
