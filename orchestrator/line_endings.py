"""A file's line endings and byte order mark, kept by edit_file and write_file: a model writes plain newlines."""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.file_reading import BINARY_SNIFF_BYTES

_BARE_LF = re.compile(r"(?<!\r)\n")


def with_the_files_line_endings(text: str, old: str, new: str) -> tuple[str, str]:
    """`old` and `new` with the line endings of the file's text they replace.

    A model writes plain newlines, which a CRLF file lacks: `old` is tried as given first (a
    file with both kinds has its LF part, which only that matches), then with CRLF; `new`'s
    lines end as the replaced text's do, so a CRLF file gets no bare LF lines.
    """
    if "\r\n" not in text or "\r\n" in new:
        return old, new  # an LF file, or `new` written with CRLF already
    if old in text:
        return old, _crlf(new) if _ends_lines_with_crlf(text, old) else new
    crlf_old = _crlf(old)
    if "\n" in old and "\r\n" not in old and crlf_old in text:
        return crlf_old, _crlf(new)
    return old, new


_BARE_LF_BYTES = re.compile(rb"(?<!\r)\n")
_UTF8_BOM = b"\xef\xbb\xbf"


def as_the_file_was(target: Path, content: str) -> str:
    """`content` with the byte order mark and the CRLF line ends of the file it replaces, where that
    file has them and `content` does not: a model writes plain newlines, and a Windows file it wrote
    whole came out changed on every line (edit_file keeps them too)."""
    try:
        with open(target, "rb") as handle:
            head = handle.read(BINARY_SNIFF_BYTES)
    except OSError:  # a file this user may write but not read: written as given
        return content
    if content and head.startswith(_UTF8_BOM) and not content.startswith("\ufeff"):
        content = "\ufeff" + content
    if b"\r\n" in head and not _BARE_LF_BYTES.search(head) and "\r\n" not in content:
        content = _crlf(content)
    return content


def _ends_lines_with_crlf(text: str, old: str) -> bool:
    """Whether the lines around `old` (found in `text`) end with CRLF."""
    if "\n" in old:
        return "\r\n" in old
    line_end = text.find("\n", text.find(old) + len(old))
    if line_end < 0:  # the last line: the file's own habit
        return _BARE_LF.search(text) is None
    return text[line_end - 1 : line_end] == "\r"


def _crlf(text: str) -> str:
    return text.replace("\n", "\r\n")
