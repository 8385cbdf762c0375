"""What keeps the agent's own commands (`run_command`) off the user's things.

A task's worktree shares with the user's checkout every branch, tag and the stash,
and the repository's `.git/config`; the user's home holds the global git config.
A clumsy model's `git checkout main && git commit`, `git stash pop`, `git tag -f`,
`git push`, `git config user.email ...` or `npm install` (a husky project sets
`core.hooksPath`) would change them, and no rollback of the worktree undoes that.
The agent's commands therefore run with:

- git hooks of overnight's own: `reference-transaction` refuses a change to any ref
  but the task's branch and the worktree's own (HEAD, bisect, rebase), so those
  commands fail with a line saying why (git >= 2.28); `pre-push` refuses every push
  (the morning's person decides what leaves the machine);
- a global git config of their own, which reads the user's but takes the writes;
- the repository's config put back after any command that changed it (`kept_config`);
- `git stash` (but `list` and `show`) refused before git runs: the stash is shared, and
  a `git stash; ...; git stash pop` with nothing to stash pops the user's entry;
- full-screen editors found first on PATH as programs that fail at once: with no
  terminal they would wait for keys until the command's time limit.

The task's check and overnight's own git run without any of this.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from orchestrator.commands import WORKTREE_GIT_CONFIG

SCREEN_PROGRAMS = ("vi", "vim", "nvim", "view", "vimdiff", "nano", "pico", "emacs", "joe", "micro", "mcedit")
_SCREEN_REFUSAL = """#!/bin/sh
echo "overnight: ${0##*/} needs a terminal, and commands here have none; write files with the file tools instead" >&2
exit 1
"""
# Per-worktree refs (HEAD and the like have no refs/ prefix) and remote-tracking ones (a fetch) may move.
_REF_GUARD = """#!/bin/sh
[ "$1" = prepared ] || exit 0
while read -r old new ref; do
  case "$ref" in
    "$OVERNIGHT_BRANCH"|refs/bisect/*|refs/worktree/*|refs/rewritten/*|refs/remotes/*) ;;
    refs/*)
      echo "overnight: refused: git here may change only the branch ${OVERNIGHT_BRANCH#refs/heads/}, not $ref, which the user's repository shares" >&2
      exit 1 ;;
  esac
done
exit 0
"""
# `git stash pop` applies the user's stash and then drops it, before any ref is written (which the
# hook could refuse): stash commands that change anything are refused before git runs.
_GIT_FRONT = """#!BASH
args=("$@"); at=0
while (( at < ${#args[@]} )); do
  case "${args[at]}" in
    -C|-c|--git-dir|--work-tree|--namespace|--config-env) at=$((at + 2)) ;;
    -*) at=$((at + 1)) ;;
    *) break ;;
  esac
done
if [[ "${args[at]}" == stash && "${args[at + 1]}" != list && "${args[at + 1]}" != show ]]; then
  echo "overnight: refused: the stash is shared with the user's own checkout; to keep a change aside, copy the file or commit it on this branch" >&2
  exit 1
fi
exec GIT "$@"
"""
_PUSH_REFUSAL = """#!/bin/sh
echo "overnight: refused: nothing is pushed from an overnight worktree; a person reviews the branch in the morning" >&2
exit 1
"""
CONFIG_RESTORED = (
    "[overnight: this command changed the repository's git config, which the user's own checkout shares; "
    "it was put back. Commits here need no git settings.]"
)
BRANCH_VARIABLE = "OVERNIGHT_BRANCH"
# Which of commands.WORKTREE_GIT_ENV's GIT_CONFIG_VALUE_<n> sets core.hooksPath.
_HOOKS_PATH_INDEX = list(WORKTREE_GIT_CONFIG).index("core.hooksPath")

_made: list[Path] = []  # the private folder, made once per process
_made_lock = threading.Lock()


@dataclass(frozen=True)
class Confinement:
    """Where one task's agent works: its branch (`overnight/<task>`) and the repository's shared config file."""

    branch: str
    shared_config: Path | None = None


def agent_environment(confinement: Confinement | None) -> dict[str, str]:
    """What to add to a command's environment (after WORKTREE_GIT_ENV) for the agent's own commands."""
    folder = _private_folder()
    if folder is None:  # nowhere to write them (a full disk): the commands run as the check does
        return {}
    env = {"PATH": os.pathsep.join(filter(None, (str(folder / "bin"), os.environ.get("PATH", os.defpath))))}
    env["GIT_CONFIG_GLOBAL"] = str(folder / "global-config")
    if confinement is not None:
        env[f"GIT_CONFIG_VALUE_{_HOOKS_PATH_INDEX}"] = str(folder / "hooks")
        env[BRANCH_VARIABLE] = f"refs/heads/{confinement.branch}"
    return env


class kept_config:
    """A with-block after which `path` holds the bytes it held before (or is absent again);
    `.restored` says whether it had to be put back."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._before: bytes | None = None
        self.restored = False

    def __enter__(self) -> "kept_config":
        if self._path is not None:
            self._before = _read(self._path)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._path is None or _read(self._path) == self._before:
            return
        if self._before is None:
            self._path.unlink(missing_ok=True)
        else:
            # Whole or not at all: git reads this file in every process, the user's too.
            spare = self._path.with_name(self._path.name + ".overnight")
            spare.write_bytes(self._before)
            os.replace(spare, self._path)
        self.restored = True


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _private_folder() -> Path | None:
    """Made once per process, removed when it ends: bin/ (refusing editors, git's front), hooks/, global-config."""
    with _made_lock:
        if not _made:
            folder: Path | None = None
            try:
                folder = Path(tempfile.mkdtemp(prefix="overnight-agent-"))
                atexit.register(shutil.rmtree, folder, ignore_errors=True)
                for name in SCREEN_PROGRAMS:
                    _write_program(folder / "bin" / name, _SCREEN_REFUSAL)
                bash, git = shutil.which("bash"), shutil.which("git")
                if bash and git:
                    _write_program(folder / "bin" / "git", _GIT_FRONT.replace("BASH", bash, 1).replace("exec GIT", f"exec {_quoted(git)}"))
                _write_program(folder / "hooks" / "reference-transaction", _REF_GUARD)
                _write_program(folder / "hooks" / "pre-push", _PUSH_REFUSAL)
                (folder / "global-config").write_text(_including(_users_global_configs()))
            except OSError:
                folder = None
            _made.append(folder)
        return _made[0]


def _write_program(path: Path, text: str) -> None:
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _users_global_configs() -> list[str]:
    """The files git reads as the user's global config, in git's order (the later wins)."""
    if os.environ.get("GIT_CONFIG_GLOBAL"):
        return [os.environ["GIT_CONFIG_GLOBAL"]]
    home = os.environ.get("HOME")
    xdg = os.environ.get("XDG_CONFIG_HOME") or (os.path.join(home, ".config") if home else "")
    found = [os.path.join(xdg, "git", "config")] if xdg else []
    return found + ([os.path.join(home, ".gitconfig")] if home else [])


def _including(paths: list[str]) -> str:
    """A git config that reads `paths` (absent ones are skipped by git) and holds nothing itself."""
    quoted = ['"' + path.replace("\\", "\\\\").replace('"', '\\"') + '"' for path in paths]
    return "[include]\n" + "".join(f"\tpath = {path}\n" for path in quoted)
