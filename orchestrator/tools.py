"""The agent's tools, bound to one task's worktree.

Every path stays inside the worktree and out of `.git`. Each tool judges its
own outcome (`ToolResult.ok`) and, when it fails, says in one line what the
model should do instead: a small model follows a plain instruction better than
it debugs an error.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import time
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Sequence

from orchestrator import search
from orchestrator.commands import UNATTENDED_ENV, WORKTREE_GIT_ENV, base_environment, cap_text, git_ceilings, how_it_ended, run_shell
from orchestrator.config import ALL_TOOLS, check_tool_names
from orchestrator.confinement import CONFIG_RESTORED, Confinement, agent_environment, kept_config
from orchestrator.files import replace_file, write_over
from orchestrator.records import BrokenCall, ModelResponse, ToolCall, ToolResult
from orchestrator.surrogates import mend, unmend_name
from orchestrator.tokens import window_chars
from orchestrator.toolcalls import arguments_problem, parse_calls

MAX_SEARCH_MATCHES = 100
# One tool result may take about this share of the model's context window (at ~3 chars a token),
# so that the prompt, the history and the next few results still fit: 1843 chars for 4096 tokens.
DEFAULT_OUTPUT_CHARS = 8000
_MIN_OUTPUT_CHARS = 1500
_OUTPUT_SHARE_OF_WINDOW = 0.15
_SEARCH_LINE_CHARS = 200
_SEARCH_MAX_FILE_BYTES = 2_000_000
_BINARY_SNIFF_BYTES = 8192
# An `old` found this often is counted no further: the model only needs to hear it is not unique.
_MOST_OCCURRENCES_COUNTED = 1000
# Room kept in a capped output for the words of the note that says how to read on (its path comes on top).
_NOTE_ROOM = 200
# A file this big is data or a log, not code to edit; read whole, it could exhaust the memory.
_EDIT_MAX_FILE_BYTES = 20_000_000
# Folders a search from above skips: they are big and never the code to change.
_SEARCH_SKIP_DIRS = {".venv", "venv", "node_modules", "__pycache__", ".mypy_cache", ".pytest_cache", ".tox"}


def _string(description: str) -> dict[str, str]:
    return {"type": "string", "description": description}


def _integer(description: str) -> dict[str, str]:
    return {"type": "integer", "description": description}


def _function(name: str, description: str, properties: dict[str, Any], required: Sequence[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(required)},
        },
    }


_PATH = _string("File path relative to the project root, like src/app.py")
_SCHEMAS: dict[str, dict[str, Any]] = {
    "read_file": _function(
        "read_file",
        "Show the text of one file: all of it, or the lines from start_line to end_line.",
        {
            "path": _PATH,
            "start_line": _integer("First line to show, counting from 1 (default: the first)"),
            "end_line": _integer("Last line to show (default: the last)"),
        },
        ["path"],
    ),
    "write_file": _function(
        "write_file",
        "Create a file, or replace ALL of its text. Give the complete new file content.",
        {"path": _PATH, "content": _string("The complete text the file should have")},
        ["path", "content"],
    ),
    "edit_file": _function(
        "edit_file",
        "Replace one exact piece of text in a file. `old` must appear exactly once in the file, "
        "with the same spaces and indentation; include nearby lines to make it unique.",
        {
            "path": _PATH,
            "old": _string("The exact text to replace, copied from the file"),
            "new": _string("The text to put in its place"),
        },
        ["path", "old", "new"],
    ),
    "list_dir": _function(
        "list_dir",
        "List the files and folders in a folder. Folders end with /.",
        {"path": _string('Folder path relative to the project root; "." is the root (default)')},
        [],
    ),
    "search": _function(
        "search",
        "Find lines matching a regex or plain text in the project's files. Shows file:line: text.",
        {
            "pattern": _string("Regular expression or plain text to look for"),
            "path": _string('File or folder to search in; "." is the whole project (default)'),
        },
        ["pattern"],
    ),
    "run_check": _function(
        "run_check",
        "Run the task's check (its tests). Exit code 0 means the task is done.",
        {},
        [],
    ),
    "submit": _function(
        "submit",
        "Say you are finished. Call it only after run_check passes.",
        {"summary": _string("One or two sentences on what you changed")},
        ["summary"],
    ),
    "run_command": _function(
        "run_command",
        "Run a shell command in the project root and show its output. It cannot read input.",
        {"command": _string("The shell command, like: python -m pytest -x tests/test_app.py")},
        ["command"],
    ),
}


def output_cap_for(context_window: int | None) -> int:
    """The most chars one tool result shows a model with this context window (in tokens; None: not known)."""
    if not context_window:
        return DEFAULT_OUTPUT_CHARS
    share = window_chars(context_window, _OUTPUT_SHARE_OF_WINDOW)
    return max(_MIN_OUTPUT_CHARS, min(DEFAULT_OUTPUT_CHARS, share))


def offered(allowed: Sequence[str]) -> list[str]:
    """The tools a task offers the model, in the order the model sees them."""
    return [name for name in ALL_TOOLS if name in allowed]


def schemas_of(names: Sequence[str]) -> list[dict[str, Any]]:
    return [_SCHEMAS[name] for name in names]


class _Refused(Exception):
    """A tool cannot do what was asked; the message tells the model what to do instead."""


class Toolbox:
    """The tools one task may use, confined to `root`."""

    def __init__(
        self,
        root: Path,
        allowed: Sequence[str],
        *,
        check_command: str,
        check_timeout_s: float = 600,
        command_timeout_s: float = 120,
        max_output_chars: int = DEFAULT_OUTPUT_CHARS,
        cancel: Any = None,
        confinement: Confinement | None = None,
        pass_env: Sequence[str] = (),
        redact: Callable[[str], str] = str,
    ) -> None:
        """`confinement`: the task's branch and the repository's shared config, which the agent's
        commands may not change (without it, in a folder that is no task's worktree, editors
        are still refused and `git config --global` still kept from the user's). `pass_env`: the
        secret-named variables the check (run_check) still gets, which the agent's own commands never
        do; `redact`: what every output goes through (orchestrator/secrecy.py)."""
        check_tool_names(allowed)
        self.root = Path(root).resolve()
        self._root_text = str(self.root)
        self._root_prefix = os.path.join(self._root_text, "")
        self._allowed = offered(allowed)
        self._check_command = check_command
        self._check_timeout_s = check_timeout_s
        self._command_timeout_s = command_timeout_s
        self._max_output_chars = max_output_chars
        self._cancel = cancel
        self._confinement = confinement
        self._pass_env = tuple(pass_env)
        self._redact = redact
        self._handlers: dict[str, Callable[..., ToolResult]] = {
            "read_file": self._read_file,
            "write_file": self._write_file,
            "edit_file": self._edit_file,
            "list_dir": self._list_dir,
            "search": self._search,
            "run_check": self._run_check,
            "submit": self._submit,
            "run_command": self._run_command,
        }

    def names(self) -> list[str]:
        return list(self._allowed)

    def schemas(self) -> list[dict[str, Any]]:
        return schemas_of(self._allowed)

    def parse(self, response: ModelResponse) -> list[ToolCall | BrokenCall]:
        return parse_calls(response, self.schemas())

    def execute(self, call: ToolCall) -> ToolResult:
        if call.name not in self._allowed:
            return ToolResult(False, f"there is no tool named {call.name!r}; use one of: {', '.join(self._allowed)}")
        problem = arguments_problem(_SCHEMAS[call.name]["function"]["parameters"], call.arguments)
        if problem:
            return ToolResult(False, f"{call.name}: {problem}")
        try:
            result = self._handlers[call.name](**call.arguments)
        except _Refused as refusal:
            # A refusal may quote the file (edit_file's lines alike): capped and redacted as any output.
            return ToolResult(False, self._as_shown_to_the_model(str(refusal)))
        except (OSError, UnicodeError) as exc:
            # The worktree's absolute path would lead the model to paths the tools refuse.
            error = f"{exc.__class__.__name__}: {exc}".replace(self._root_text + os.sep, "")
            return ToolResult(False, self._as_shown_to_the_model(f"{call.name} failed: {error}"))
        return ToolResult(result.ok, self._as_shown_to_the_model(result.output), result.submitted)

    def _as_shown_to_the_model(self, output: str) -> str:
        # A file name that is not UTF-8 comes back from the file system as lone surrogates, which
        # no transcript or database could write: shown as escapes (orchestrator/surrogates.py).
        return cap_text(self._redact(mend(output)), self._max_output_chars)

    # --- paths ---------------------------------------------------------------

    def _resolve(self, path: str) -> Path:
        """`path` inside the root, or _Refused: no absolute paths, no escapes, no .git."""
        if not path.strip():
            raise _Refused("the path is empty; give a path relative to the project root, like src/app.py")
        if "\0" in path:
            raise _Refused(f"{path!r} contains a NUL character, which no file name can hold; give a path like src/app.py")
        # A name that is not UTF-8 was shown to the model as escapes (see execute).
        path = unmend_name(path)
        if os.path.isabs(path) or path.startswith("~"):
            raise _Refused(f"{path!r} is an absolute path; use a path relative to the project root, like src/app.py")
        names = [name for name in path.split("/") if name not in ("", ".")]
        if any(_is_git(name) for name in names):
            raise _Refused(f"{path!r} is inside .git, which the tools may not touch")
        target = None if ".." in names else self._joined_without_links(names)
        if target is None:
            # resolve() follows the links and the "..", so a way out of the project is caught too.
            try:
                target = (self.root / path).resolve()
            except RuntimeError:  # Python's word for a symlink loop
                raise _Refused(f"{path!r} goes through a symbolic link that loops back on itself; use another path") from None
            if not target.is_relative_to(self.root):
                raise _Refused(f"{path!r} is outside the project; only files under the project root can be used")
            if any(_is_git(name) for name in target.relative_to(self.root).parts):
                raise _Refused(f"{path!r} is inside .git, which the tools may not touch")
        return target

    def _joined_without_links(self, names: list[str]) -> Path | None:
        """root/names if no part of it below the root is a symlink, else None.

        Then it is what resolve() would give, for one lstat a part below the root
        instead of one for every part from / down: tools run on every turn.
        """
        current = self._root_text
        for name in names:
            current = os.path.join(current, name)
            try:
                if stat.S_ISLNK(os.lstat(current).st_mode):
                    return None
            except OSError:
                break  # missing from here down, so no link below either
        return Path(self._root_text, *names)

    def _shown(self, target: Path) -> str:
        return target.relative_to(self.root).as_posix() or "."

    def _existing_file(self, path: str) -> Path:
        target = self._resolve(path)
        if target.is_dir():
            raise _Refused(f"{path!r} is a folder, not a file; use list_dir to see what is in it")
        if not target.is_file():
            if os.path.lexists(target):  # listed by list_dir: "not found" sent the model looking for it
                raise _Refused(f"{path!r} is not a regular file (a pipe, socket or device); it cannot be read or edited")
            if "\\" in path:  # a Windows path
                slashed = path.replace("\\", "/")
                raise _Refused(f"file not found: {path!r}; separate folders with /, like {slashed!r}")
            raise _Refused(f"file not found: {path!r}; use list_dir or search to find the right path")
        return target

    # --- tools ---------------------------------------------------------------

    def _read_file(self, path: str, start_line: int | None = None, end_line: int | None = None) -> ToolResult:
        target = self._existing_file(path)
        if start_line is None and end_line is None:
            return self._read_whole(path, target)
        first = 1 if start_line is None else start_line
        if first < 1 or (end_line is not None and end_line < first):
            raise _Refused("start_line counts from 1, and end_line may not be below it; give a range like start_line=1, end_line=40")
        return self._read_lines(path, target, first, end_line)

    def _read_whole(self, path: str, target: Path) -> ToolResult:
        with open(target, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            # No more than can be shown: a log of gigabytes must not be read whole into memory.
            data = handle.read(4 * self._max_output_chars + _BINARY_SNIFF_BYTES)
        if b"\0" in data[:_BINARY_SNIFF_BYTES]:
            return ToolResult(False, _binary_message(path, size))
        text = data.decode("utf-8", errors="replace")
        if not text:
            return ToolResult(True, f"({path} is empty)")
        complete = len(data) >= size
        warning = "" if _is_utf8(data, complete=complete) else _not_utf8_note(path)
        if len(text) + len(warning) <= self._max_output_chars and complete:
            return ToolResult(True, _with_note(text, warning))
        length = f"{len(text)} chars" if complete else f"{size} bytes"
        # Redacted before the cut, as every output is (execute): a secret on a line the cut splits left its first part.
        shown = _whole_lines(self._redact(text)[: self._max_output_chars - _NOTE_ROOM - len(path) - len(warning)])
        if "\n" not in shown:  # one line longer than the cap: nothing to read on from
            cut = f"[... {path} has {length}; only the first {len(shown)} chars are shown.]"
        else:
            last = shown.count("\n")
            cut = f"[... {path} has {length}; only lines 1-{last} are shown. {_read_on(last + 1)}]"
        return ToolResult(True, _with_note(shown, cut, warning))

    def _read_lines(self, path: str, target: Path, first: int, last: int | None) -> ToolResult:
        """Lines `first` to `last` (None: to the end), as many as fit in the output."""
        room = self._max_output_chars - _NOTE_ROOM - len(path) - len(_not_utf8_note(path))
        shown: list[str] = []
        used = number = 0
        warning = ""
        with open(target, "rb") as handle:
            if b"\0" in handle.read(_BINARY_SNIFF_BYTES):
                return ToolResult(False, _binary_message(path, os.fstat(handle.fileno()).st_size))
            handle.seek(0)
            for number, line in _numbered_lines(handle, longest=4 * self._max_output_chars):
                if number < first:
                    continue
                if last is not None and number > last:
                    break
                if not warning and not _is_utf8(line, complete=line.endswith(b"\n")):
                    warning = _not_utf8_note(path)
                text = line.decode("utf-8", errors="replace")
                if used + len(text) > room:
                    # Redacted before the cut: see _read_whole.
                    return ToolResult(True, _with_note(*_cut_range(shown, first, number, self._redact(text), room), warning))
                shown.append(text)
                used += len(text)
        if number == 0:
            return ToolResult(True, f"({path} is empty)")
        if number < first:
            raise _Refused(f"{path} ends at line {number}, so it has no line {first}; give a start_line from 1 to {number}")
        return ToolResult(True, _with_note("".join(shown), warning))

    def _write_file(self, path: str, content: str) -> ToolResult:
        ending = next((end for end in ("/", "/.") if path.rstrip().endswith(end)), "")
        if ending:
            # Written as asked, `tests/` (or `tests/.`) became a file named tests, and every later tests/x.py failed.
            name = path.rstrip()
            while name.endswith(("/", "/.")):
                name = name.removesuffix("/") if name.endswith("/") else name.removesuffix("/.")
            name = name or "src"
            like = name if "." in name.rsplit("/", 1)[-1].lstrip(".") else f"{name}/new_file.py"  # app.py/: the file meant
            raise _Refused(
                f"{path!r} ends with {ending}, as a folder's path does; write_file makes a file (and its folders): "
                f"give the file's path, like {like}"
            )
        target = self._resolve(path)
        try:
            existed = True
            mode = os.stat(target).st_mode
            if stat.S_ISDIR(mode):
                raise _Refused(f"{path!r} is a folder; give a file path")
            if not stat.S_ISREG(mode):
                # A pipe would wait for a reader that never comes, and hang the iteration.
                raise _Refused(f"{path!r} is not a regular file (a pipe, socket or device); write another path")
        except OSError:
            existed = False
            if "\\" in path:
                # A Windows path: src\app.py would be made as one file of that name, at the top.
                raise _Refused(f"{path!r} has a backslash; separate folders with /, like src/app.py") from None
            if any(name != name.strip() for name in path.split("/")):
                # A space or line break the model let slip in: `app.py\n` would be a second app.py no import finds.
                tidy = "/".join(name.strip() for name in path.split("/"))
                raise _Refused(f"{path!r} has spaces or line breaks at the start or end of a name; give it without them, like {tidy!r}") from None
            self._make_folders_for(target, path)
        if existed and "\ufffd" in content and not _file_is_utf8(target):
            # Most likely the text read_file showed, written back: every byte shown as \ufffd would be lost.
            raise _Refused(
                f"{path} is not UTF-8 text, and its bytes shown as \ufffd would be lost; "
                "change it with edit_file, choosing an `old` without them"
            )
        if existed:
            content = _as_the_file_was(target, content)
        _overwrite(target, content)
        verb = "replaced" if existed else "created"
        return ToolResult(True, f"{verb} {self._shown(target)} ({_count_lines(content)} lines)")

    def _make_folders_for(self, target: Path, path: str) -> None:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            # A file where a folder of the path should be: said by its name in the project, not as
            # an error that shows the worktree's absolute path (which the tools then refuse).
            below = target.relative_to(self.root).parents
            file = next((folder for folder in reversed(below) if _exists_but_not_a_folder(self.root / folder)), None)
            if file is None:
                raise
            raise _Refused(
                f"{file.as_posix()!r} is a file, not a folder, so {path!r} cannot be made in it; give another path"
            ) from None

    def _edit_file(self, path: str, old: str, new: str) -> ToolResult:
        target = self._existing_file(path)
        if not old:
            raise _Refused("`old` is empty; copy the exact text to replace from the file, or use write_file")
        if old == new:
            raise _Refused("`old` and `new` are the same, so nothing would change")
        size = target.stat().st_size
        if size > _EDIT_MAX_FILE_BYTES:
            raise _Refused(f"{path!r} has {size} bytes, more than edit_file takes ({_EDIT_MAX_FILE_BYTES}); leave it as it is")
        # surrogateescape: the bytes of a file that is not UTF-8 (Latin-1, say) are written back as they were.
        with open(target, encoding="utf-8", errors="surrogateescape", newline="") as handle:
            text = handle.read()
        old, new = _with_the_files_line_endings(text, old, new)
        if old == new:  # `new` differed in line ends only, and takes the file's own: nothing would change
            raise _Refused(f"`old` and `new` differ only in line ends, and {path} keeps its own (CRLF), so nothing would change")
        count = _occurrences(text, old)
        if count == 0 and "\ufffd" in old and text != mend(text):
            raise _Refused(
                f"{path} is not UTF-8 text, and the bytes read_file shows as \ufffd cannot be matched; "
                "give an `old` without them"
            )
        if count == 0:
            raise _Refused(_not_found_message(path, old, text))
        if count > 1:
            times = f"{count} times" if count < _MOST_OCCURRENCES_COUNTED else f"{count} times or more"
            raise _Refused(
                f"`old` appears {times} in {path}; include more of the surrounding lines so it appears once"
            )
        _overwrite(target, text.replace(old, new, 1), errors="surrogateescape")
        return ToolResult(
            True, f"edited {self._shown(target)}: replaced {_count_lines(old)} lines with {_count_lines(new)} lines"
        )

    def _list_dir(self, path: str = ".") -> ToolResult:
        path = path if path.strip() else "."  # "" is how many small models say "the project"
        target = self._resolve(path)
        if target.is_file():
            raise _Refused(f"{path!r} is a file, not a folder; use read_file to see it")
        if not target.is_dir():
            raise _Refused(f"folder not found: {path!r}; use list_dir on \".\" to see the project's top level")
        entries = sorted(
            entry.name + ("/" if entry.is_dir() else "") for entry in target.iterdir() if not _is_git(entry.name)
        )
        return ToolResult(True, "\n".join(entries) if entries else f"({path} is empty)")

    def _search(self, pattern: str, path: str = ".") -> ToolResult:
        """The `search` tool: the lines matching `pattern` in the files at `path`, the whole project by default."""
        if not pattern:
            raise _Refused("the pattern is empty; give the text or regular expression to look for")
        path = path if path.strip() else "."  # "" is how many small models say "the whole project"
        matcher = _search_matcher(pattern)
        target, named_content = self._search_target(path)
        return self._search_files(target, named_content, matcher, pattern, path)

    def _search_target(self, path: str) -> tuple[Path, bytes | None]:
        """Where to search, and a file's bytes when `path` names a file (read once, to tell why search
        skips it if it does); refused when `path` is not there, or names a file search skips."""
        target = self._resolve(path)
        if not target.exists():
            raise _Refused(f"not found: {path!r}; use \".\" to search the whole project")
        named_content = None if target.is_dir() else _search_content(str(target), None)
        if isinstance(named_content, _Skipped):
            # Asked for by name, a file search skips is no file without matches.
            raise _Refused(f"{path!r} {named_content.reason}")
        return target, named_content

    def _search_files(self, target: Path, named_content: bytes | None, matcher: search.Matcher, pattern: str, path: str) -> ToolResult:
        """The lines matching in the files at `target` (`path` as the model gave it), file by file, until
        MAX_SEARCH_MATCHES are passed or SEARCH_TIMEOUT_S is spent; refused when one file's text takes it."""
        ignored = self._ignored_under(target) if target.is_dir() else set()
        deadline = time.monotonic() + search.SEARCH_TIMEOUT_S
        matches: list[str] = []
        searched = 0
        try:
            for file, info in self._files_under(target, ignored):
                if self._cancel is not None:
                    self._cancel.raise_if_cancelled()
                now = time.monotonic()
                if now > deadline and searched:
                    # Many files (a large project searched from its top): what was found so far,
                    # and how to make the next search quicker. The first file is always searched:
                    # listing a large folder can take the whole time on a slow disk or host.
                    return _search_out_of_time(matches, searched)
                # A file begun near the end still gets a moment of its own (files over 2 MB are skipped).
                room = max(deadline, now + search.FILE_MIN_TIME_S)
                # A file asked for by name was read once, to tell why it is skipped, if it is.
                content = _search_content(file, info) if named_content is None else named_content
                if not isinstance(content, _Skipped):
                    matches.extend(self._matches_in(file, content, matcher, MAX_SEARCH_MATCHES + 1 - len(matches), room))
                searched += 1
                if len(matches) > MAX_SEARCH_MATCHES:
                    return _search_too_many_matches(matches)
        except TimeoutError:  # inside one file's text: the pattern
            raise _Refused(
                f"search stopped after {search.SEARCH_TIMEOUT_S:g}s: the pattern {pattern!r} backtracks too much; "
                "search for plain text, or a pattern without nested repeats like (a+)+"
            ) from None
        return _search_answer(matches, pattern, path)

    def _files_under(self, target: Path, ignored: set[str]) -> Iterator[tuple[str, os.stat_result | None]]:
        """The files to search, as paths, each with its os.lstat when that is also its os.stat (not a link)."""
        if target.is_file():
            yield str(target), None
            return
        # os.walk follows no folder link, and `target` has none (_resolve): only a file that is a
        # link needs resolving (resolving every file was half of a large project's search).
        # Paths are strings, not Path: pathlib's parsing was a third of a large project's search.
        for folder, dirs, files in os.walk(target):
            dirs[:] = sorted(
                d for d in dirs if not _is_git(d) and d not in _SEARCH_SKIP_DIRS and os.path.join(folder, d) + "/" not in ignored
            )
            inside = os.path.join(folder, "")
            # A worktree's or submodule's `.git` is a file, naming where its repository lies.
            for file in sorted(inside + name for name in files if not _is_git(name)):
                if file in ignored:
                    continue
                try:
                    info = os.lstat(file)
                except OSError:
                    yield file, None  # gone: _search_content finds so
                    continue
                if not stat.S_ISLNK(info.st_mode):
                    yield file, info
                    continue
                # It may point out of the project or into .git, or loop; such files are not searched.
                try:
                    if not self._inside_and_out_of_git(Path(file).resolve()):
                        continue
                except (OSError, RuntimeError):
                    continue
                yield file, None

    def _inside_and_out_of_git(self, resolved: Path) -> bool:
        return resolved.is_relative_to(self.root) and not any(_is_git(name) for name in resolved.relative_to(self.root).parts)

    def _ignored_under(self, target: Path) -> set[str]:
        """The untracked files and folders (these ending in "/") under `target` that git ignores, as
        paths below `target`'s own: generated output (build/, dist/) that would crowd out the
        project's own lines. Empty when `target` is itself ignored (searched as asked), or git cannot
        tell (the agent broke the worktree's .git link: everything is searched, as before)."""
        env = {**base_environment(), **UNATTENDED_ENV, **WORKTREE_GIT_ENV, "GIT_CEILING_DIRECTORIES": git_ceilings(self.root), "GIT_OPTIONAL_LOCKS": "0"}
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

    def _matches_in(self, file: str, data: bytes, matcher: search.Matcher, limit: int, deadline: float) -> list[str]:
        """`file:line: text` for the first `limit` matching lines of a text file's bytes; see orchestrator/search.py."""
        shown = file[len(self._root_prefix):] if file.startswith(self._root_prefix) else os.path.basename(file)
        lines = matcher.lines_in(data, limit, deadline)
        # Indentation kept: a model copies these lines into edit_file's `old`. Redacted before the cut to
        # _SEARCH_LINE_CHARS: a secret the cut splits (a long line of JSON) left its first part.
        return [f"{shown}:{number}: {self._redact(line.rstrip())[:_SEARCH_LINE_CHARS]}" for number, line in lines]

    def _run_check(self) -> ToolResult:
        result = run_shell(
            self._check_command, self.root, self._check_timeout_s, self._max_output_chars, cancel=self._cancel, pass_env=self._pass_env,
            redact=self._redact,
        )
        if result.timed_out:
            return ToolResult(False, f"the check timed out after {self._check_timeout_s:g}s\n{result.output}")
        if result.exit_code == 0:
            return ToolResult(True, f"the check passed (exit code 0)\n{result.output}".rstrip())
        ended = f" ({how_it_ended(result.exit_code)})" if result.exit_code >= 0 else f": {how_it_ended(result.exit_code)}"
        return ToolResult(False, f"the check failed{ended}\n{result.output}".rstrip())

    def _submit(self, summary: str) -> ToolResult:
        return ToolResult(True, "submitted", submitted=True)

    def _run_command(self, command: str) -> ToolResult:
        if not command.strip():
            raise _Refused("the command is empty; give a shell command to run")
        if "\0" in command:
            raise _Refused("the command contains a NUL character, which a shell command cannot hold; write it without one")
        shared_config = self._confinement.shared_config if self._confinement else None
        with kept_config(shared_config, self._confinement.config_copy if self._confinement else None) as config:
            result = run_shell(
                command, self.root, self._command_timeout_s, self._max_output_chars, cancel=self._cancel,
                extra_env=agent_environment(self._confinement), redact=self._redact,
            )
        output = f"{how_it_ended(result.exit_code)}\n{result.output}".rstrip()
        return ToolResult(result.exit_code == 0, f"{output}\n{CONFIG_RESTORED}" if config.restored else output)


def _is_git(name: str) -> bool:
    """Whether a file name is .git's: on a case-insensitive file system (macOS, Windows) .GIT is .git too."""
    return name.casefold() == ".git"


def _overwrite(target: Path, text: str, errors: str = "strict") -> None:
    """Write `text` as the whole of `target`, creating it if need be.

    Written over the old bytes, then cut to length (files.write_over), instead of opened
    with O_TRUNC: 0.3-1 ms for every edit of a file that git has committed. A crash halfway
    leaves a mixed file either way, and the iteration's rollback restores it.
    A file with other hard links (uv and pnpm link installed packages to their cache, shared
    by every project on the machine) is replaced instead, so that only the worktree's copy changes.
    """
    data = text.encode("utf-8", errors)  # before opening: a text that cannot be encoded leaves the file untouched
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        info = os.fstat(fd)
        if info.st_nlink > 1:
            # The rollback restores the worktree's copy: no sync needed, as for an edit in place.
            replace_file(target, data, mode=stat.S_IMODE(info.st_mode), sync=False)
            return
        write_over(fd, data)
    finally:
        os.close(fd)


_BARE_LF = re.compile(r"(?<!\r)\n")


def _with_the_files_line_endings(text: str, old: str, new: str) -> tuple[str, str]:
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


def _as_the_file_was(target: Path, content: str) -> str:
    """`content` with the byte order mark and the CRLF line ends of the file it replaces, where that
    file has them and `content` does not: a model writes plain newlines, and a Windows file it wrote
    whole came out changed on every line (edit_file keeps them too)."""
    try:
        with open(target, "rb") as handle:
            head = handle.read(_BINARY_SNIFF_BYTES)
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


def _occurrences(text: str, old: str) -> int:
    """How often `old` is in `text`, overlapping ones too (str.count finds "a\na" once in "a\na\na"),
    up to _MOST_OCCURRENCES_COUNTED."""
    count, at = 0, -1
    while count < _MOST_OCCURRENCES_COUNTED and (at := text.find(old, at + 1)) >= 0:
        count += 1
    return count


def _exists_but_not_a_folder(path: Path) -> bool:
    return os.path.lexists(path) and not path.is_dir()


def _search_matcher(pattern: str) -> search.Matcher:
    """`pattern` compiled for search; refused when its counted repeats make it too big to compile."""
    try:
        return search.Matcher.of(search.compile_pattern(pattern))
    except search.PatternTooBig:
        raise _Refused(
            f"the pattern {pattern!r} repeats too much to compile (over {search.MOST_UNROLLED_COPIES} copies "
            "by its counted repeats like {1000}); search for plain text, or use smaller counts"
        ) from None


def _search_out_of_time(matches: list[str], searched: int) -> ToolResult:
    """The matches found in the `searched` files before search's time ran out, and how to search quicker."""
    found = "\n".join(matches) + "\n" if matches else ""
    return ToolResult(
        bool(matches),
        f"{found}[search stopped after {search.SEARCH_TIMEOUT_S:g}s with {searched} files searched; "
        "give a narrower path, a folder]",
    )


def _search_too_many_matches(matches: list[str]) -> ToolResult:
    """The first MAX_SEARCH_MATCHES of `matches`, and how to ask for fewer."""
    shown = "\n".join(matches[:MAX_SEARCH_MATCHES])
    return ToolResult(
        True,
        f"{shown}\n[stopped after {MAX_SEARCH_MATCHES} matches; use a narrower pattern or path]",
    )


def _search_answer(matches: list[str], pattern: str, path: str) -> ToolResult:
    """A search that ran to its end: its matches, or that there were none (and why, perhaps)."""
    if not matches:
        if "\n" in pattern or "\\n" in pattern:
            # Text copied from a file, several lines of it: there, but never on one line.
            return ToolResult(True, f"no matches for {pattern!r} in {path}; search matches one line at a time: search for one line of it")
        return ToolResult(True, f"no matches for {pattern!r} in {path}")
    return ToolResult(True, "\n".join(matches))


@dataclass(frozen=True)
class _Skipped:
    """Why search skips a file, as it is said after the file's name (when the model named that file)."""

    reason: str


_NOT_REGULAR = _Skipped("is not a regular file (a pipe, socket or device); search looks in files only")
_BINARY = _Skipped("is a binary file; search looks in text files only")


def _search_content(file: str, info: os.stat_result | None) -> bytes | _Skipped:
    """A file's bytes, or why search skips it: not a regular file, over 2 MB, unreadable or binary.
    `info`: its os.stat, when already known. One judgement for a file named and a file met in a folder."""
    try:
        info = os.stat(file) if info is None else info
        # A pipe (made by a command the model ran) would block the read for ever.
        if not stat.S_ISREG(info.st_mode):
            return _NOT_REGULAR
        if info.st_size > _SEARCH_MAX_FILE_BYTES:
            return _Skipped(
                f"has {info.st_size} bytes, more than search reads ({_SEARCH_MAX_FILE_BYTES}); "
                "read the part you need with read_file, start_line and end_line"
            )
        data = _read_whole(file, info.st_size)
    except OSError as error:
        return _Skipped(f"cannot be read ({error.strerror or error}); give another path")
    return _BINARY if data.find(b"\0", 0, _BINARY_SNIFF_BYTES) >= 0 else data


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


def _binary_message(path: str, size: int) -> str:
    return f"{path!r} is a binary file ({size} bytes); it cannot be shown as text"


def _whole_lines(text: str) -> str:
    """`text` up to its last line break, if it has one: a line cut in half could not be copied into edit_file."""
    end = text.rfind("\n")
    return text[: end + 1] if end >= 0 else text


def _read_on(next_line: int) -> str:
    return f"Read on with read_file and start_line={next_line} (end_line is optional), or use search to find the lines you need."


def _numbered_lines(handle: BinaryIO, *, longest: int) -> Iterator[tuple[int, bytes]]:
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


def _cut_range(shown: list[str], first: int, number: int, line: str, room: int) -> tuple[str, str]:
    """Lines `first` to `number` - 1, and a note on how to read on from line `number`, which did not fit."""
    if shown:
        return "".join(shown), f"[... only lines {first}-{number - 1} fit in the output. {_read_on(number)}]"
    return line[:room], f"[... line {number} is too long to show whole; only its first {room} chars are shown. {_read_on(number + 1)}]"


def _with_note(text: str, *notes: str) -> str:
    """`text` with the notes that are not empty, each on a line of its own after it."""
    lines = [note for note in notes if note]
    if not lines:
        return text
    return text + ("" if text.endswith("\n") else "\n") + "\n".join(lines)


def _is_utf8(data: bytes, *, complete: bool) -> bool:
    """Whether `data` is UTF-8; a character cut at the end of an incomplete read is no sign against it."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        return not complete and error.reason == "unexpected end of data"
    return True


def _file_is_utf8(target: Path) -> bool:
    with open(target, "rb") as handle:
        data = handle.read(_EDIT_MAX_FILE_BYTES)
        return _is_utf8(data, complete=not handle.read(1))


def _not_utf8_note(path: str) -> str:
    return (
        f"[{path} is not UTF-8 text: its bytes that are not UTF-8 are shown as \ufffd. edit_file keeps them, "
        "but cannot match them: choose an `old` without them. write_file would lose them.]"
    )


def _count_lines(text: str) -> int:
    return len(text.splitlines())


def _not_found_message(path: str, old: str, text: str) -> str:
    alike = _lines_alike(old, text)
    if alike:
        first, last = alike
        lines = text.split("\n")[first - 1 : last]
        # Shown as read_file shows them: a byte that is not UTF-8 (surrogateescape) as \ufffd.
        quoted = "\n".join(_as_shown(line.rstrip("\r")) for line in lines)
        return (
            f"`old` was not found exactly in {path}, but similar text with different spaces or indentation is "
            f"there, at lines {first}-{last}; copy `old` exactly from these lines:\n{quoted}"
        )
    label = _SEARCH_LABEL.match(old)
    if label and label.group(0) not in text:
        # Copied from search's output with its `file:line: ` label, which the file does not hold.
        return f"`old` was not found in {path}: it starts with {label.group(0)!r}, search's label for the line; leave that out"
    return f"`old` was not found in {path}; read_file to see its current text and copy `old` exactly from it"


# How search labels each line it shows: `path:line: `.
_SEARCH_LABEL = re.compile(r"[^\n:]+:\d+: ")


def _as_shown(text: str) -> str:
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _lines_alike(old: str, text: str) -> tuple[int, int] | None:
    """The first and last line (from 1) of `text` that hold `old` when each line's surrounding
    whitespace and the blank lines are ignored; None when it is not there even so."""
    wanted = _squeeze(old)
    if not wanted:
        return None
    offsets: list[int] = []  # where each kept line starts in the squeezed text
    numbers: list[int] = []
    kept: list[str] = []
    offset = 0
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            offsets.append(offset)
            numbers.append(number)
            kept.append(line.strip())
            offset += len(kept[-1]) + 1
    at = "\n".join(kept).find(wanted)
    if at < 0:
        return None
    return numbers[bisect_right(offsets, at) - 1], numbers[bisect_right(offsets, at + len(wanted) - 1) - 1]


def _squeeze(text: str) -> str:
    """Text with each line's surrounding whitespace and blank lines removed."""
    return "\n".join(line.strip() for line in text.split("\n") if line.strip())
