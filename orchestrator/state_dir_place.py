"""Where a `[state] dir` may not be: a folder whose files are someone else's, which a night's own files would overwrite.

A night writes notes.md (and rewrites it, with `keep_notes_days`), runs.db and its lock files in the state dir; its
clean-ups there touch only its own transcripts and worktrees (overnights_own.py). In the home folder, a folder above it
(`/`), or a folder of a checkout whose files git tracks, those files would overwrite the user's own.
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.checkout import checkout_top, first_tracked
from orchestrator.printable import visible


def outside_home_problem(state: Path) -> str | None:
    """Why `state` (absolute, resolved) is the user's home or a folder above it (`/`), or None."""
    for home_dir in _homes():
        if state == home_dir:
            return "your home folder"
        if home_dir.is_relative_to(state):
            return f"a folder your home ({home_dir}) is in"
    return None


def _homes() -> list[Path]:
    """`~` (HOME), and the home the password database gives this user: HOME set elsewhere (a CI job's temporary folder)
    leaves the files in that one the user's all the same (`dir = "~root"` reached them). Empty where neither is a path."""
    found = [os.path.expanduser("~")]
    try:
        import pwd

        found.append(pwd.getpwuid(os.getuid()).pw_dir)
    except (ImportError, KeyError):  # a uid with no entry (a container's): HOME alone
        pass
    homes: list[Path] = []
    for home in found:
        # Not absolute: no HOME and no password entry, there is no home to keep the state dir out of.
        if os.path.isabs(home) and Path(os.path.realpath(home)) not in homes:
            homes.append(Path(os.path.realpath(home)))
    return homes


def tracked_files_problem(state: Path) -> str | None:
    """Why `state` (absolute, resolved) is in a checkout among files git tracks there (one named), or None.

    Whichever checkout holds it, as git finds it from the state dir's nearest existing folder: the repository's, but
    also its main checkout when `[repo] path` is a linked worktree, a submodule's, or another project's."""
    folder = state
    while not _is_folder(folder) and folder != folder.parent:
        folder = folder.parent
    # git with overnight's scrubbed environment, as checkout.py runs it: an inherited GIT_DIR named another repository's
    # files as this folder's (and its checkout as the folder itself).
    found = checkout_top(folder)
    if found is None:  # in no checkout (or one git will not read): nothing tracked
        return None
    top = Path(os.path.realpath(found))
    try:
        relative = state.relative_to(top)
    except ValueError:
        return None
    tracked = first_tracked(top, relative.as_posix())
    if not tracked:
        return None
    return f"inside the checkout {top}, with files git tracks ({visible(tracked)})"


def _is_folder(path: Path) -> bool:
    # A name too long, a folder this user may not enter: not one to ask git from (the state dir's own check says why).
    try:
        return path.is_dir()
    except OSError:
        return False
