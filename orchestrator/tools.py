"""The agent's tools, bound to one task's worktree.

Every path stays inside the worktree and out of `.git`. Each tool judges its
own outcome (`ToolResult.ok`) and, when it fails, says in one line what the
model should do instead: a small model follows a plain instruction better than
it debugs an error.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from orchestrator import search
from orchestrator.command_endings import how_it_ended
from orchestrator.command_output import cap_text
from orchestrator.commands import run_shell
from orchestrator.confinement import Confinement, agent_environment
from orchestrator.edit_matching import MOST_OCCURRENCES_COUNTED, not_found_message, occurrences
from orchestrator.file_reading import (
    BINARY_SNIFF_BYTES, binary_message, cut_range, is_utf8, not_utf8_note, numbered_lines, read_on, whole_lines, with_note,
)
from orchestrator.files import replace_file, write_over
from orchestrator.gitdir import is_git
from orchestrator.line_endings import as_the_file_was, with_the_files_line_endings
from orchestrator.records import BrokenCall, ModelResponse, ToolCall, ToolResult
from orchestrator.search_tool import (
    MAX_SEARCH_MATCHES, Skipped, files_under, ignored_under, search_answer, search_content, search_out_of_time, search_too_many_matches,
)
from orchestrator.shared_config import CONFIG_RESTORED, kept_config
from orchestrator.surrogates import mend, unmend_name
from orchestrator.tokens import window_chars
from orchestrator.tool_names import check_tool_names
from orchestrator.tool_schemas import SCHEMAS, offered, schemas_of
from orchestrator.toolcalls import arguments_problem, parse_calls

# One tool result may take about this share of the model's context window (at ~3 chars a token),
# so that the prompt, the history and the next few results still fit: 1843 chars for 4096 tokens.
DEFAULT_OUTPUT_CHARS = 8000
_MIN_OUTPUT_CHARS = 1500
_OUTPUT_SHARE_OF_WINDOW = 0.15
_SEARCH_LINE_CHARS = 200
# Room kept in a capped output for the words of the note that says how to read on (its path comes on top).
_NOTE_ROOM = 200
# A file this big is data or a log, not code to edit; read whole, it could exhaust the memory.
_EDIT_MAX_FILE_BYTES = 20_000_000


def output_cap_for(context_window: int | None) -> int:
    """The most chars one tool result shows a model with this context window (in tokens; None: not known)."""
    if not context_window:
        return DEFAULT_OUTPUT_CHARS
    share = window_chars(context_window, _OUTPUT_SHARE_OF_WINDOW)
    return max(_MIN_OUTPUT_CHARS, min(DEFAULT_OUTPUT_CHARS, share))


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
        do; `redact`: what every output goes through (orchestrator/redactor.py)."""
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
        problem = arguments_problem(SCHEMAS[call.name]["function"]["parameters"], call.arguments)
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
        if any(is_git(name) for name in names):
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
            if any(is_git(name) for name in target.relative_to(self.root).parts):
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
            data = handle.read(4 * self._max_output_chars + BINARY_SNIFF_BYTES)
        if b"\0" in data[:BINARY_SNIFF_BYTES]:
            return ToolResult(False, binary_message(path, size))
        text = data.decode("utf-8", errors="replace")
        if not text:
            return ToolResult(True, f"({path} is empty)")
        complete = len(data) >= size
        warning = "" if is_utf8(data, complete=complete) else not_utf8_note(path)
        if len(text) + len(warning) <= self._max_output_chars and complete:
            return ToolResult(True, with_note(text, warning))
        length = f"{len(text)} chars" if complete else f"{size} bytes"
        # Redacted before the cut, as every output is (execute): a secret on a line the cut splits left its first part.
        shown = whole_lines(self._redact(text)[: self._max_output_chars - _NOTE_ROOM - len(path) - len(warning)])
        if "\n" not in shown:  # one line longer than the cap: nothing to read on from
            cut = f"[... {path} has {length}; only the first {len(shown)} chars are shown.]"
        else:
            last = shown.count("\n")
            cut = f"[... {path} has {length}; only lines 1-{last} are shown. {read_on(last + 1)}]"
        return ToolResult(True, with_note(shown, cut, warning))

    def _read_lines(self, path: str, target: Path, first: int, last: int | None) -> ToolResult:
        """Lines `first` to `last` (None: to the end), as many as fit in the output."""
        room = self._max_output_chars - _NOTE_ROOM - len(path) - len(not_utf8_note(path))
        shown: list[str] = []
        used = number = 0
        warning = ""
        with open(target, "rb") as handle:
            if b"\0" in handle.read(BINARY_SNIFF_BYTES):
                return ToolResult(False, binary_message(path, os.fstat(handle.fileno()).st_size))
            handle.seek(0)
            for number, line in numbered_lines(handle, longest=4 * self._max_output_chars):
                if number < first:
                    continue
                if last is not None and number > last:
                    break
                if not warning and not is_utf8(line, complete=line.endswith(b"\n")):
                    warning = not_utf8_note(path)
                text = line.decode("utf-8", errors="replace")
                if used + len(text) > room:
                    # Redacted before the cut: see _read_whole.
                    return ToolResult(True, with_note(*cut_range(shown, first, number, self._redact(text), room), warning))
                shown.append(text)
                used += len(text)
        if number == 0:
            return ToolResult(True, f"({path} is empty)")
        if number < first:
            raise _Refused(f"{path} ends at line {number}, so it has no line {first}; give a start_line from 1 to {number}")
        return ToolResult(True, with_note("".join(shown), warning))

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
            content = as_the_file_was(target, content)
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
        old, new = with_the_files_line_endings(text, old, new)
        if old == new:  # `new` differed in line ends only, and takes the file's own: nothing would change
            raise _Refused(f"`old` and `new` differ only in line ends, and {path} keeps its own (CRLF), so nothing would change")
        count = occurrences(text, old)
        if count == 0 and "\ufffd" in old and text != mend(text):
            raise _Refused(
                f"{path} is not UTF-8 text, and the bytes read_file shows as \ufffd cannot be matched; "
                "give an `old` without them"
            )
        if count == 0:
            raise _Refused(not_found_message(path, old, text))
        if count > 1:
            times = f"{count} times" if count < MOST_OCCURRENCES_COUNTED else f"{count} times or more"
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
            entry.name + ("/" if entry.is_dir() else "") for entry in target.iterdir() if not is_git(entry.name)
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
        named_content = None if target.is_dir() else search_content(str(target), None)
        if isinstance(named_content, Skipped):
            # Asked for by name, a file search skips is no file without matches.
            raise _Refused(f"{path!r} {named_content.reason}")
        return target, named_content

    def _search_files(self, target: Path, named_content: bytes | None, matcher: search.Matcher, pattern: str, path: str) -> ToolResult:
        """The lines matching in the files at `target` (`path` as the model gave it), file by file, until
        MAX_SEARCH_MATCHES are passed or SEARCH_TIMEOUT_S is spent; refused when one file's text takes it."""
        ignored = ignored_under(self.root, target) if target.is_dir() else set()
        deadline = time.monotonic() + search.SEARCH_TIMEOUT_S
        matches: list[str] = []
        searched = 0
        try:
            for file, info in files_under(self.root, target, ignored):
                if self._cancel is not None:
                    self._cancel.raise_if_cancelled()
                now = time.monotonic()
                if now > deadline and searched:
                    # Many files (a large project searched from its top): what was found so far,
                    # and how to make the next search quicker. The first file is always searched:
                    # listing a large folder can take the whole time on a slow disk or host.
                    return search_out_of_time(matches, searched)
                # A file begun near the end still gets a moment of its own (files over 2 MB are skipped).
                room = max(deadline, now + search.FILE_MIN_TIME_S)
                # A file asked for by name was read once, to tell why it is skipped, if it is.
                content = search_content(file, info) if named_content is None else named_content
                if not isinstance(content, Skipped):
                    matches.extend(self._matches_in(file, content, matcher, MAX_SEARCH_MATCHES + 1 - len(matches), room))
                searched += 1
                if len(matches) > MAX_SEARCH_MATCHES:
                    return search_too_many_matches(matches)
        except TimeoutError:  # inside one file's text: the pattern
            raise _Refused(
                f"search stopped after {search.SEARCH_TIMEOUT_S:g}s: the pattern {pattern!r} backtracks too much; "
                "search for plain text, or a pattern without nested repeats like (a+)+"
            ) from None
        return search_answer(matches, pattern, path)

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
        return ToolResult(False, f"the check failed: {how_it_ended(result.exit_code)}\n{result.output}".rstrip())

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


def _file_is_utf8(target: Path) -> bool:
    with open(target, "rb") as handle:
        data = handle.read(_EDIT_MAX_FILE_BYTES)
        return is_utf8(data, complete=not handle.read(1))


def _count_lines(text: str) -> int:
    return len(text.splitlines())
