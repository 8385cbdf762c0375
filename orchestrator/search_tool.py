"""The `search` tool's files and answers: which files a search looks in (no .git, no folders like .venv,
nothing git ignores, no file it cannot read as text, each said why when named) and what it says when it ends.
The lines that match in a file are found by orchestrator/search.py, its engine."""

from __future__ import annotations

import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from orchestrator import search
from orchestrator.command_environment import git_ceilings, worktree_git_environment
from orchestrator.file_reading import BINARY_SNIFF_BYTES
from orchestrator.gitdir import is_git
from orchestrator.records import ToolResult

MAX_SEARCH_MATCHES = 100
_SEARCH_MAX_FILE_BYTES = 2_000_000
# Folders a search from above skips: they are big and never the code to change.
_SEARCH_SKIP_DIRS = {".venv", "venv", "node_modules", "__pycache__", ".mypy_cache", ".pytest_cache", ".tox"}


@dataclass(frozen=True)
class Skipped:
    """Why search skips a file, as it is said after the file's name (when the model named that file)."""

    reason: str


_NOT_REGULAR = Skipped("is not a regular file (a pipe, socket or device); search looks in files only")
_BINARY = Skipped("is a binary file; search looks in text files only")


def search_content(file: str, info: os.stat_result | None) -> bytes | Skipped:
    """A file's bytes, or why search skips it: not a regular file, over 2 MB, unreadable or binary.
    `info`: its os.stat, when already known. One judgement for a file named and a file met in a folder."""
    try:
        info = os.stat(file) if info is None else info
        # A pipe (made by a command the model ran) would block the read for ever.
        if not stat.S_ISREG(info.st_mode):
            return _NOT_REGULAR
        if info.st_size > _SEARCH_MAX_FILE_BYTES:
            return Skipped(
                f"has {info.st_size} bytes, more than search reads ({_SEARCH_MAX_FILE_BYTES}); "
                "read the part you need with read_file, start_line and end_line"
            )
        data = _read_whole(file, info.st_size)
    except OSError as error:
        return Skipped(f"cannot be read ({error.strerror or error}); give another path")
    return _BINARY if data.find(b"\0", 0, BINARY_SNIFF_BYTES) >= 0 else data


def _read_whole(file: str, size: int) -> bytes:
    """All of a file's bytes, `size` of them when it has not grown: with os.read, a third of the
    time Path.read_bytes took on a project of small files."""
    descriptor = os.open(file, os.O_RDONLY)
    try:
        data = os.read(descriptor, size + 1)
        rest = os.read(descriptor, 1 << 20) if data else b""
        while rest:  # it grew since its stat
            data += rest
            rest = os.read(descriptor, 1 << 20)
        return data
    finally:
        os.close(descriptor)


def files_under(root: Path, target: Path, ignored: set[str]) -> Iterator[tuple[str, os.stat_result | None]]:
    """The files to search, as paths, each with its os.lstat when that is also its os.stat (not a link)."""
    if target.is_file():
        yield str(target), None
        return
    # os.walk follows no folder link, and `target` has none (ToolPaths.resolve): only a file that is a
    # link needs resolving (resolving every file was half of a large project's search).
    # Paths are strings, not Path: pathlib's parsing was a third of a large project's search.
    for folder, dirs, files in os.walk(target):
        dirs[:] = sorted(
            d for d in dirs if not is_git(d) and d not in _SEARCH_SKIP_DIRS and os.path.join(folder, d) + "/" not in ignored
        )
        inside = os.path.join(folder, "")
        # A worktree's or submodule's `.git` is a file, naming where its repository lies.
        for file in sorted(inside + name for name in files if not is_git(name)):
            if file in ignored:
                continue
            try:
                info = os.lstat(file)
            except OSError:
                yield file, None  # gone: search_content finds so
                continue
            if not stat.S_ISLNK(info.st_mode):
                yield file, info
                continue
            # It may point out of the project or into .git, or loop; such files are not searched.
            try:
                if not _inside_and_out_of_git(root, Path(file).resolve()):
                    continue
            except (OSError, RuntimeError):
                continue
            yield file, None


def _inside_and_out_of_git(root: Path, resolved: Path) -> bool:
    return resolved.is_relative_to(root) and not any(is_git(name) for name in resolved.relative_to(root).parts)


def ignored_under(root: Path, target: Path) -> set[str]:
    """The untracked files and folders (these ending in "/") under `target` that git ignores, as
    paths below `target`'s own: generated output (build/, dist/) that would crowd out the
    project's own lines. Empty when `target` is itself ignored (searched as asked), or git cannot
    tell (the agent broke the worktree's .git link: everything is searched, as before)."""
    env = {**worktree_git_environment(), "GIT_CEILING_DIRECTORIES": git_ceilings(root), "GIT_OPTIONAL_LOCKS": "0"}
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory"],
            cwd=target, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=search.SEARCH_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return set()
    names = [name for name in os.fsdecode(listed.stdout).split("\0") if name] if listed.returncode == 0 else []
    if "./" in names:
        return set()
    return {os.path.join(target, name) for name in names}


def search_out_of_time(matches: list[str], searched: int) -> ToolResult:
    """The matches found in the `searched` files before search's time ran out, and how to search quicker."""
    found = "\n".join(matches) + "\n" if matches else ""
    return ToolResult(
        bool(matches),
        f"{found}[search stopped after {search.SEARCH_TIMEOUT_S:g}s with {searched} files searched; "
        "give a narrower path, a folder]",
    )


def search_too_many_matches(matches: list[str]) -> ToolResult:
    """The first MAX_SEARCH_MATCHES of `matches`, and how to ask for fewer."""
    shown = "\n".join(matches[:MAX_SEARCH_MATCHES])
    return ToolResult(
        True,
        f"{shown}\n[stopped after {MAX_SEARCH_MATCHES} matches; use a narrower pattern or path]",
    )


def search_answer(matches: list[str], pattern: str, path: str) -> ToolResult:
    """A search that ran to its end: its matches, or that there were none (and why, perhaps)."""
    if not matches:
        if "\n" in pattern or "\\n" in pattern:
            # Text copied from a file, several lines of it: there, but never on one line.
            return ToolResult(True, f"no matches for {pattern!r} in {path}; search matches one line at a time: search for one line of it")
        return ToolResult(True, f"no matches for {pattern!r} in {path}")
    return ToolResult(True, "\n".join(matches))
