"""The paths the model gives the tools, resolved inside the tools' root and kept out of `.git`, and shown back
relative to it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from orchestrator.gitdir import is_git
from orchestrator.surrogates import unmend_name
from orchestrator.tool_refusal import Refused


class ToolPaths:
    """The paths under `root` that the tools may use."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.root_text = str(self.root)

    def resolve(self, path: str) -> Path:
        """`path` inside the root, or Refused: no absolute paths, no escapes, no .git."""
        if not path.strip():
            raise Refused("the path is empty; give a path relative to the project root, like src/app.py")
        if "\0" in path:
            raise Refused(f"{path!r} contains a NUL character, which no file name can hold; give a path like src/app.py")
        # A name that is not UTF-8 was shown to the model as escapes (see Toolbox.execute).
        path = unmend_name(path)
        if os.path.isabs(path) or path.startswith("~"):
            raise Refused(f"{path!r} is an absolute path; use a path relative to the project root, like src/app.py")
        names = [name for name in path.split("/") if name not in ("", ".")]
        if any(is_git(name) for name in names):
            raise Refused(f"{path!r} is inside .git, which the tools may not touch")
        target = None if ".." in names else self._joined_without_links(names)
        if target is None:
            # resolve() follows the links and the "..", so a way out of the project is caught too.
            try:
                target = (self.root / path).resolve()
            except RuntimeError:  # Python's word for a symlink loop
                raise Refused(f"{path!r} goes through a symbolic link that loops back on itself; use another path") from None
            if not target.is_relative_to(self.root):
                raise Refused(f"{path!r} is outside the project; only files under the project root can be used")
            if any(is_git(name) for name in target.relative_to(self.root).parts):
                raise Refused(f"{path!r} is inside .git, which the tools may not touch")
        return target

    def _joined_without_links(self, names: list[str]) -> Path | None:
        """root/names if no part of it below the root is a symlink, else None.

        Then it is what resolve() would give, for one lstat a part below the root
        instead of one for every part from / down: tools run on every turn.
        """
        current = self.root_text
        for name in names:
            current = os.path.join(current, name)
            try:
                if stat.S_ISLNK(os.lstat(current).st_mode):
                    return None
            except OSError:
                break  # missing from here down, so no link below either
        return Path(self.root_text, *names)

    def shown(self, target: Path) -> str:
        """`target` (resolved) as the model would give it."""
        return target.relative_to(self.root).as_posix() or "."

    def existing_file(self, path: str) -> Path:
        """`path` resolved, or Refused when no regular file is there, saying where to look instead."""
        target = self.resolve(path)
        if target.is_dir():
            raise Refused(f"{path!r} is a folder, not a file; use list_dir to see what is in it")
        if not target.is_file():
            if os.path.lexists(target):  # listed by list_dir: "not found" sent the model looking for it
                raise Refused(f"{path!r} is not a regular file (a pipe, socket or device); it cannot be read or edited")
            if "\\" in path:  # a Windows path
                slashed = path.replace("\\", "/")
                raise Refused(f"file not found: {path!r}; separate folders with /, like {slashed!r}")
            raise Refused(f"file not found: {path!r}; use list_dir or search to find the right path")
        return target
