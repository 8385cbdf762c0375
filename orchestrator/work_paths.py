"""Which paths of a worktree git lists as work: tracked, or untracked and neither ignored nor under `[repo] keep`.

`keep` paths (a check's .venv or build cache that .gitignore does not name) are no work for a commit, a rollback, gc
or a kept branch alike; they are judged as `git clean -e` judges them ("/build" at the top only, "node_modules" at any
depth), so each of those asks git the same way.
"""

from __future__ import annotations

from typing import Callable, Sequence


def untracked(git: Callable[..., str], keep: Sequence[str], env: dict[str, str] | None = None) -> list[str]:
    """Untracked paths, not ignored and outside `keep` (the patterns `git clean -e` takes). `env`: another index."""
    excludes = [f"--exclude={pattern}" for pattern in keep]
    return [name for name in git("ls-files", "-z", "--others", "--exclude-standard", *excludes, env=env).split("\0") if name]


def untracked_all(git: Callable[..., str]) -> list[str]:
    """Untracked paths not ignored, `keep` paths included."""
    return [name for name in git("ls-files", "-z", "--others", "--exclude-standard").split("\0") if name]


def tracked_paths(git: Callable[..., str]) -> list[str]:
    """Every path the index holds (a sparse index is listed expanded)."""
    return [name for name in git("ls-files", "-z").split("\0") if name]


def kept_by_clean(keep: Sequence[str]) -> list[str]:
    """`git clean`'s arguments that spare the `keep` paths."""
    return [arg for path in keep for arg in ("-e", path)]
