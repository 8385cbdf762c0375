"""A commit's size limit (`max_file_bytes`): the new files over it refused as `file_too_large`, before anything
is committed, whether `git add` staged them or the agent staged or committed them itself.

Each reader takes `run_git(*args) -> str`: one git command in the worktree (`Worktree._git`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from orchestrator.errors import QualityError
from orchestrator.staged import new_content, staged_changes


def refuse_large_staged(run_git: Callable[..., str], folder: Path, base: str, limit: int) -> bool:
    """QualityError for the new blobs over `limit` bytes that the index of the worktree at `folder` holds against
    `base` (the checkpoint): what `git add` staged now, and what the agent staged or committed itself. A blob
    `base` already has (a rename, a mode change of a tracked file) is no new weight. Whether the
    index differs from `base` at all."""
    raw = run_git("diff-index", "--cached", "--raw", "-z", "--no-renames", base)
    new: dict[str, str] = {}
    for change in new_content(list(staged_changes(raw))):
        new.setdefault(change.new_blob, change.path)
    wanted = list(new)
    large = []
    for blob in wanted:
        path = new[blob]
        try:  # the file first (no process for the usual small one), then the blob (a filter's, LFS's, is small)
            if os.lstat(folder / path).st_size <= limit:
                continue
        except OSError:
            pass
        size = int(run_git("cat-file", "-s", blob).strip() or 0)
        if size > limit:
            large.append((path, size))
    if large:
        raise _too_large(
            large, limit, "staged", ". Leave them out of your changes (delete a file you made, `git rm --cached` one you "
            "staged), or write such output where git ignores it (a build or output folder the repository's .gitignore "
            "names), then submit again.",
        )
    return bool(raw)


def refuse_large_committed(run_git: Callable[..., str], base: str, limit: int) -> None:
    """QualityError for a blob over `limit` bytes in the agent's own commits on top of `base` that `base`
    does not have: the branch carries it even when a later commit removed the file. One process; a
    second only to name what was found."""
    omitted = run_git("rev-list", "--objects", f"--filter=blob:limit={limit + 1}", "--filter-print-omitted", f"{base}..HEAD")
    blobs = {line[1:] for line in omitted.splitlines() if line.startswith("~")}
    if not blobs:
        return
    names = {}
    for line in run_git("rev-list", "--objects", f"{base}..HEAD").splitlines():
        blob, _, path = line.partition(" ")
        if blob in blobs:
            names.setdefault(blob, path)
    large = [(names.get(blob, blob), int(run_git("cat-file", "-s", blob))) for blob in sorted(blobs)[:5]]
    raise _too_large(
        large, limit, "committed", ", in a commit of yours (removing the file in a later commit still leaves it in "
        "the branch's history). Write such output where git ignores it, then submit again.",
    )


def _too_large(large: list[tuple[str, int]], limit: int, how: str, advice: str) -> QualityError:
    """`file_too_large` for (path, size) pairs; `how` they came (staged, committed), `advice` after the list."""
    shown = ", ".join(f"{_named(path)} ({_size_over(size, limit)})" for path, size in large[:5])
    return QualityError(
        "file_too_large",
        f"Files over {limit / 1e6:g} MB are not committed: {shown}{advice}",
        evidence=f"{how}: {shown}",
        message=f"file over {limit / 1e6:g} MB: {_named(large[0][0])}",
    )


def _named(path: str) -> str:
    """A path as the message, the note and the report name it: its repr where it is not printable, so a name holding
    a line break (`'a\\nb'`) does not read as one holding a backslash and an `n` (`a\\nb`) once `report` shows the
    line break as `\\n`; as an unknown tool's name is shown (guards/_describe.name_for_message)."""
    return path if path.isprintable() else repr(path)


def _size_over(size: int, limit: int) -> str:
    """A file's size as the note shows it: MB to one decimal, or its bytes where those would not read
    as over the limit ("Files over 20 MB ...: dump.bin (20.0 MB)", "over 0.001 MB: log.txt (0.0 MB)")."""
    megabytes = f"{size / 1e6:.1f}"
    return f"{megabytes} MB" if float(megabytes) > limit / 1e6 else f"{size:,} bytes"
