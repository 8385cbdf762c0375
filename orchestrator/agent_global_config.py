"""The global git config of the agent's commands: a file of overnight's that reads the user's and takes the
writes (`git config --global` leaves the user's alone), with overnight's hooks for the user's repository only.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from orchestrator.files import replace_file


def users_global_configs() -> list[str]:
    """The files git reads as the user's global config, in git's order (the later wins)."""
    if os.environ.get("GIT_CONFIG_GLOBAL"):
        return [os.environ["GIT_CONFIG_GLOBAL"]]
    home = os.environ.get("HOME")
    xdg = os.environ.get("XDG_CONFIG_HOME") or (os.path.join(home, ".config") if home else "")
    found = [os.path.join(xdg, "git", "config")] if xdg else []
    return found + ([os.path.join(home, ".gitconfig")] if home else [])


def global_config_for(folder: Path, common: Path) -> Path:
    """The private global config, and overnight's hooks for the user's repository only: git drops
    GIT_CONFIG_COUNT for the git it starts in another repository (local_repo_env), so a push from a
    clone of the agent's into the user's repository runs receive-pack there with these; a test
    suite's fixture repository keeps its own (a pre-receive hook under test)."""
    import hashlib

    path = folder / f"global-config-{hashlib.sha1(os.fsencode(common)).hexdigest()[:16]}"
    if not path.exists() and (folder / "hooks-config").exists():
        patterns = dict.fromkeys(_GLOB_SPECIAL.sub(r"\\\g<0>", place) for place in (os.path.abspath(common), os.path.realpath(common)))
        hooks = config_quoted(str(folder / "hooks-config"))
        conditions = "".join(f"[includeIf {config_quoted(f'gitdir:{pattern}/')}]\n\tpath = {hooks}\n" for pattern in patterns)
        replace_file(path, (including([str(folder / "global-config")]) + conditions).encode(), sync=False)
    return path if path.exists() else folder / "global-config"


_GLOB_SPECIAL = re.compile(r"[*?\[\\]")


def config_quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def including(paths: list[str]) -> str:
    """A git config that reads `paths` (absent ones are skipped by git) and holds nothing itself."""
    return "[include]\n" + "".join(f"\tpath = {config_quoted(path)}\n" for path in paths)
