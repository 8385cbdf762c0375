"""Where a `[state] dir` may not be: a folder whose files are someone else's, which a night's clean-ups would reach.

A night deletes old `transcripts/*.jsonl`, removes the worktrees of this repository it finds in `worktrees/` (a
person's own, kept there, too) and writes notes.md, all inside the state dir: in the home folder, a folder above it
(`/`), or a folder of the checkout whose files git tracks, those were the user's files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from orchestrator.printable import visible


def outside_home_problem(state: Path) -> str | None:
    """Why `state` (absolute, resolved) is the user's home or a folder above it (`/`), or None."""
    home = os.path.expanduser("~")
    if not os.path.isabs(home):  # no HOME and no password entry: there is no home to keep the state dir out of
        return None
    home_dir = Path(os.path.realpath(home))
    if state == home_dir:
        return "your home folder"
    if home_dir.is_relative_to(state):
        return f"a folder your home ({home_dir}) is in"
    return None


def tracked_files_problem(repo: Any, state: Path, top: Path) -> str | None:
    """Why `state`, inside the checkout at `top`, holds files of the user's (one that git tracks, named), or None."""
    try:
        relative = state.relative_to(top)
    except ValueError:
        return None
    # `:(literal)`: a folder named `*` or `[ab]` is that folder, not a pattern over the whole checkout.
    tracked = repo.git.ls_files("-z", "--", f":(literal){relative.as_posix()}").split("\0")[0]
    if not tracked:
        return None
    return f"inside the checkout, with files git tracks ({visible(tracked)})"
