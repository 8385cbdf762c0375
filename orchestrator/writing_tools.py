"""The tools that change files: write_file (a file's whole text, its folders made) and edit_file (one place in it
replaced), each written over the old bytes in place."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from orchestrator.edit_matching import MOST_OCCURRENCES_COUNTED, not_found_message, occurrences
from orchestrator.file_reading import is_utf8
from orchestrator.files import replace_file, write_over
from orchestrator.line_endings import as_the_file_was, with_the_files_line_endings
from orchestrator.records import ToolResult
from orchestrator.surrogates import mend
from orchestrator.tool_paths import ToolPaths
from orchestrator.tool_refusal import Refused

# A file this big is data or a log, not code to edit; read whole, it could exhaust the memory.
_EDIT_MAX_FILE_BYTES = 20_000_000


def write_file(paths: ToolPaths, path: str, content: str) -> ToolResult:
    """The `write_file` tool: `content` as the whole of the file at `path`, which is made (with its folders) if need be."""
    _refuse_a_folders_path(path)
    target = paths.resolve(path)
    try:
        existed = True
        mode = os.stat(target).st_mode
        if stat.S_ISDIR(mode):
            raise Refused(f"{path!r} is a folder; give a file path")
        if not stat.S_ISREG(mode):
            # A pipe would wait for a reader that never comes, and hang the iteration.
            raise Refused(f"{path!r} is not a regular file (a pipe, socket or device); write another path")
    except OSError:
        existed = False
        if "\\" in path:
            # A Windows path: src\app.py would be made as one file of that name, at the top.
            raise Refused(f"{path!r} has a backslash; separate folders with /, like src/app.py") from None
        if any(name != name.strip() for name in path.split("/")):
            # A space or line break the model let slip in: `app.py\n` would be a second app.py no import finds.
            tidy = "/".join(name.strip() for name in path.split("/"))
            raise Refused(f"{path!r} has spaces or line breaks at the start or end of a name; give it without them, like {tidy!r}") from None
        _make_folders_for(paths.root, target, path)
    if existed and "\ufffd" in content and not _file_is_utf8(target):
        # Most likely the text read_file showed, written back: every byte shown as \ufffd would be lost.
        raise Refused(
            f"{path} is not UTF-8 text, and its bytes shown as \ufffd would be lost; "
            "change it with edit_file, choosing an `old` without them"
        )
    if existed:
        content = as_the_file_was(target, content)
    _overwrite(target, content)
    verb = "replaced" if existed else "created"
    return ToolResult(True, f"{verb} {paths.shown(target)} ({_count_lines(content)} lines)")


def edit_file(paths: ToolPaths, path: str, old: str, new: str) -> ToolResult:
    """The `edit_file` tool: the one place `old` appears in the file at `path` replaced by `new`, line ends as the file has them."""
    target = paths.existing_file(path)
    if not old:
        raise Refused("`old` is empty; copy the exact text to replace from the file, or use write_file")
    if old == new:
        raise Refused("`old` and `new` are the same, so nothing would change")
    size = target.stat().st_size
    if size > _EDIT_MAX_FILE_BYTES:
        raise Refused(f"{path!r} has {size} bytes, more than edit_file takes ({_EDIT_MAX_FILE_BYTES}); leave it as it is")
    # surrogateescape: the bytes of a file that is not UTF-8 (Latin-1, say) are written back as they were.
    with open(target, encoding="utf-8", errors="surrogateescape", newline="") as handle:
        text = handle.read()
    old, new = with_the_files_line_endings(text, old, new)
    if old == new:  # `new` differed in line ends only, and takes the file's own: nothing would change
        raise Refused(f"`old` and `new` differ only in line ends, and {path} keeps its own (CRLF), so nothing would change")
    count = occurrences(text, old)
    if count == 0 and "\ufffd" in old and text != mend(text):
        raise Refused(
            f"{path} is not UTF-8 text, and the bytes read_file shows as \ufffd cannot be matched; "
            "give an `old` without them"
        )
    if count == 0:
        raise Refused(not_found_message(path, old, text))
    if count > 1:
        times = f"{count} times" if count < MOST_OCCURRENCES_COUNTED else f"{count} times or more"
        raise Refused(
            f"`old` appears {times} in {path}; include more of the surrounding lines so it appears once"
        )
    _overwrite(target, text.replace(old, new, 1), errors="surrogateescape")
    return ToolResult(
        True, f"edited {paths.shown(target)}: replaced {_count_lines(old)} lines with {_count_lines(new)} lines"
    )


def _refuse_a_folders_path(path: str) -> None:
    """Refused when `path` ends as a folder's does: written as asked, `tests/` (or `tests/.`) became a file named tests,
    and every later tests/x.py failed."""
    ending = next((end for end in ("/", "/.") if path.rstrip().endswith(end)), "")
    if not ending:
        return
    name = path.rstrip()
    while name.endswith(("/", "/.")):
        name = name.removesuffix("/") if name.endswith("/") else name.removesuffix("/.")
    name = name or "src"
    like = name if "." in name.rsplit("/", 1)[-1].lstrip(".") else f"{name}/new_file.py"  # app.py/: the file meant
    raise Refused(
        f"{path!r} ends with {ending}, as a folder's path does; write_file makes a file (and its folders): "
        f"give the file's path, like {like}"
    )


def _make_folders_for(root: Path, target: Path, path: str) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        # A file where a folder of the path should be: said by its name in the project, not as
        # an error that shows the worktree's absolute path (which the tools then refuse).
        below = target.relative_to(root).parents
        file = next((folder for folder in reversed(below) if _exists_but_not_a_folder(root / folder)), None)
        if file is None:
            raise
        raise Refused(
            f"{file.as_posix()!r} is a file, not a folder, so {path!r} cannot be made in it; give another path"
        ) from None


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


def _file_is_utf8(target: Path) -> bool:
    with open(target, "rb") as handle:
        data = handle.read(_EDIT_MAX_FILE_BYTES)
        return is_utf8(data, complete=not handle.read(1))


def _count_lines(text: str) -> int:
    return len(text.splitlines())
