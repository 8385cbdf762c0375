"""The folders of paths relative to a worktree ("a/b/c", "/" between their parts), for what `git add` is given."""

from __future__ import annotations

from typing import Sequence


def folders_of(folder: str) -> list[str]:
    """`folder` ("a/b/c") and each folder above it ("a/b", "a"); none for the top ("")."""
    parts = folder.split("/") if folder else []
    return ["/".join(parts[:depth]) for depth in range(len(parts), 0, -1)]


def fewest_exclusions(leave_out: Sequence[str], work: Sequence[str]) -> list[str]:
    """The paths in `leave_out` with each replaced by its highest folder that holds none of `work` (paths
    relative to the worktree, "/" between their parts; a folder's may end in "/"): what excludes them all
    from `git add` and nothing of `work`, in as few patterns as that allows."""
    holding_work: set[str] = set()
    for name in work:
        parts = name.rstrip("/").split("/")
        for depth in range(len(parts), 0, -1):
            folder = "/".join(parts[:depth])
            if folder in holding_work:
                break  # and so are the folders above it
            holding_work.add(folder)
    found: dict[str, None] = {}
    for name in leave_out:
        parts = name.rstrip("/").split("/")
        highest = next(("/".join(parts[:depth]) for depth in range(1, len(parts)) if "/".join(parts[:depth]) not in holding_work), None)
        found[highest if highest is not None else name] = None
    return list(found)
