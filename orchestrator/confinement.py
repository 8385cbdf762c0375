"""What keeps the agent's own commands (`run_command`) off the user's things.

A task's worktree shares with the user's checkout every branch, tag, the stash and
the reflogs, and the repository's `.git/config`; the user's home holds the global
git config. A clumsy model's `git checkout main && git commit`, `git stash pop`,
`git tag -f`, `git push`, `git config user.email ...` or `npm install` (a husky
project sets `core.hooksPath`) would change them, and no rollback of the worktree
undoes that. The agent's commands therefore run with:

- git hooks of overnight's: `reference-transaction` refuses a change to any ref
  but the task's branch and the worktree's own (HEAD, bisect, rebase), so those
  commands fail with a line saying why (git >= 2.28); `pre-push` refuses every push
  (the morning's person decides what leaves the machine), and the front below refuses
  `push` too (`--no-verify` skips the hook) and any `-c core.hooksPath=...` or included
  file (in `GIT_CONFIG_PARAMETERS` too), and names overnight's settings, the hooks and the empty
  credential helper among them, again after a command's own `GIT_CONFIG_COUNT`;
- no credential helper: the user's stored tokens do not go with the agent's fetches;
- a front for git on PATH that refuses, before git runs, what changes shared
  things without a ref transaction the hook could refuse: `git stash` (but `list`
  and `show`: `stash pop` applies and drops the user's entry first), `git branch
  -m/-c` (git writes the copy without the hook), `git reflog expire/delete/drop/write`,
  `git worktree` (but `list`: `remove --force` deletes another task's work), and
  housekeeping (`gc`, `pack-refs`, `prune`, `maintenance`, `refs migrate`), each also as what an
  alias expands to (a shell alias: refused), and as what git itself runs (`rebase --exec`, `bisect
  run`, an editor: git's exec path, first on their PATH, is a folder whose git, and the dashed names of its
  builtins (git-stash), are the front); fetches without
  tags, which the hook would refuse, and without pruning (the hook refuses to delete
  a remote-tracking ref: it can be the user's last name for unmerged commits); and, outside the task's worktree (a `cd ..`
  that lands in the user's checkout or another task's worktree, or a GIT_DIR, --git-dir
  or GIT_INDEX_FILE naming their index), the commands
  that write an index or files (the ceilings of command_environment.git_ceilings already keep
  git from climbing out of the worktree into the user's checkout);
- a global git config of their own, which reads the user's but takes the writes;
- the repository's config put back once no agent command runs any more, if one
  changed it (`kept_config`);
- full-screen editors found first on PATH as programs that fail at once: with no
  terminal they would wait for keys until the command's time limit.

The hooks and the front act in the user's repository only: a repository the
agent makes or clones for its own use (a test suite's fixtures) works as usual.
The task's check and overnight's own git run without any of this.

This module makes the fences' private folder, once a process, and the environment that puts a command
behind them; the parts are modules of their own: the git front (git_front.py), the hooks (fence_hooks.py),
git's exec path in links (git_exec_path.py), the global config (agent_global_config.py) and the
repository's config put back (shared_config.py).
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from orchestrator.agent_global_config import config_quoted, global_config_for, including, users_global_configs
from orchestrator.command_environment import WORKTREE_GIT_CONFIG
from orchestrator.fence_hooks import PUSH_REFUSAL, REF_GUARD
from orchestrator.git_exec_path import gits_own_commands, link_exec_path
from orchestrator.git_front import GIT_FRONT
from orchestrator.process_liveness import pid_alive
from orchestrator.shared_config import kept_config, restore_config_copy
from orchestrator.user_cache import user_cache_folders

SCREEN_PROGRAMS = (
    "vi", "vim", "nvim", "view", "vimdiff", "nano", "pico", "emacs", "joe", "micro", "mcedit",
    # Debian's names for the same: the `editor` alternative and vim's builds.
    "editor", "sensible-editor", "vim.basic", "vim.tiny", "vim.nox", "rvim", "rview",
)
_SCREEN_REFUSAL = """#!/bin/sh
echo "overnight: ${0##*/} needs a terminal, and commands here have none; write files with the file tools instead" >&2
exit 1
"""
BRANCH_VARIABLE = "OVERNIGHT_BRANCH"
COMMON_DIR_VARIABLE = "OVERNIGHT_COMMON_DIR"

_made: list[Path | None] = []  # the private folder, made once per process (again if it went)
_made_lock = threading.Lock()


@dataclass(frozen=True)
class Confinement:
    """Where one task's agent works: its branch (`overnight/<task>`) and the repository's shared config file;
    `config_copy`: where the config's bytes are kept while agent commands run (in the state dir), so that a
    night killed mid-command has it put back by the next night's recovery (restore_config_copy)."""

    branch: str
    shared_config: Path | None = None
    config_copy: Path | None = None


def _agent_git_settings() -> list[tuple[str, str]]:
    """The settings the agent's git gets through the environment, in order, but the fences' hooks: the worktrees'
    own, and no credential helper (an empty value empties git's list): the user's stored tokens stay theirs."""
    return [*WORKTREE_GIT_CONFIG.items(), ("credential.helper", "")]


def agent_environment(confinement: Confinement | None) -> dict[str, str]:
    """What to add to a command's environment (after WORKTREE_GIT_ENV) for the agent's own commands."""
    folder = _private_folder()
    if folder is None:  # nowhere it can run from (logged once): the commands run as the check does
        return {}
    env = {"PATH": os.pathsep.join(filter(None, (str(folder / "bin"), os.environ.get("PATH", os.defpath))))}
    env["GIT_CONFIG_GLOBAL"] = str(folder / "global-config")
    settings = _agent_git_settings()
    if confinement is not None:
        # Last, where they win; the git front names them all again after a command's own settings.
        settings.append(("core.hooksPath", str(folder / "hooks")))
        env[BRANCH_VARIABLE] = f"refs/heads/{confinement.branch}"
    env["GIT_CONFIG_COUNT"] = str(len(settings))
    for at, (key, value) in enumerate(settings):
        env[f"GIT_CONFIG_KEY_{at}"], env[f"GIT_CONFIG_VALUE_{at}"] = key, value
    if confinement is not None and confinement.shared_config is not None:
        env[COMMON_DIR_VARIABLE] = str(confinement.shared_config.parent)
        env["GIT_CONFIG_GLOBAL"] = str(global_config_for(folder, confinement.shared_config.parent))
    return env


def _private_folder() -> Path | None:
    """bin/ (the git front, refusing editors), hooks/, global-config: made once per process where
    programs may run, made again if removed meanwhile (a tmp cleaner), removed when the process ends."""
    with _made_lock:
        if _made and (_made[0] is None or _made[0].is_dir()):
            return _made[0]
        _made[:] = [_make_private_folder()]
        return _made[0]


def _make_private_folder() -> Path | None:
    bash, git = shutil.which("bash"), shutil.which("git")
    # /tmp may be mounted noexec (a common hardening): then a folder in the user's cache.
    for base in (None, *user_cache_folders("overnight")):
        folder: Path | None = None
        try:
            if base is not None:
                base.mkdir(parents=True, exist_ok=True)
            folder = Path(tempfile.mkdtemp(prefix=_FOLDER_PREFIX, dir=base))
            # Whose it is: removed at exit, or, after a kill -9, by the next night (remove_abandoned_folders).
            (folder / "pid").write_text(str(os.getpid()))
            _fill(folder, bash, git)
            if os.access(folder / "bin" / SCREEN_PROGRAMS[0], os.X_OK):
                atexit.register(_remove, folder)
                return folder
        except OSError:
            pass
        if folder is not None:
            _remove(folder)
    from orchestrator.logs import get_logger

    get_logger().warning("agent_fences_unavailable", reason="no folder where programs may run (tmp and ~/.cache noexec or full)")
    return None


_FOLDER_PREFIX = "overnight-agent-"


def remove_abandoned_folders() -> list[Path]:
    """The private folders of overnight processes that died without their exit handlers (kill -9,
    the OOM killer): one a night would otherwise pile up in /tmp, read-only parts and all."""
    removed = []
    for base in (Path(tempfile.gettempdir()), *user_cache_folders("overnight")):
        for folder in base.glob(f"{_FOLDER_PREFIX}*"):
            try:
                pid = int((folder / "pid").read_text())
            except (OSError, ValueError):
                continue  # not one with an owner to ask (an older version's, another's): left alone
            if pid != os.getpid() and not pid_alive(pid):
                _remove(folder)
                removed.append(folder)
    return removed


# Git reads the settings the fences rely on from the environment (GIT_CONFIG_COUNT: 2.31,
# GIT_CONFIG_GLOBAL: 2.32) and ignores them before that, silently.
FENCES_NEED_GIT = (2, 32)


def _fill(folder: Path, bash: str | None, git: str | None) -> None:
    for name in SCREEN_PROGRAMS:
        _write_program(folder / "bin" / name, _SCREEN_REFUSAL)
    missing = fences_missing(bash, git)
    if missing:
        from orchestrator.logs import get_logger

        get_logger().warning("agent_fences_unavailable", reason=missing)
    if bash and git:
        own_commands = " ".join(gits_own_commands(git))
        settings = [word for setting in _agent_git_settings() for word in setting]
        own_repository_settings = [word for key, value in _agent_git_settings() if key != "core.hooksPath" for word in (key, value)]

        def program(text: str) -> str:
            text = text.replace("FENCE_HOOKS", _quoted(str(folder / "hooks"))).replace("GIT_OWN_COMMANDS", own_commands)
            text = text.replace("FENCE_OWN_REPOSITORY_SETTINGS", _quoted_words(own_repository_settings))
            text = text.replace("FENCE_SETTINGS", _quoted_words(settings))
            return text.replace("BASH", bash, 1).replace("REAL_GIT", _quoted(git))

        gits_exec_path = link_exec_path(folder / "exec", git, folder / "bin" / "git")
        front = program(GIT_FRONT).replace("FENCE_GITS_EXEC_PATH", _quoted(gits_exec_path or ""))
        _write_program(folder / "bin" / "git", front.replace("FENCE_EXEC_PATH", _quoted(str(folder / "exec") if gits_exec_path else "")))
        _write_program(folder / "hooks" / "reference-transaction", program(REF_GUARD))
        _write_program(folder / "hooks" / "pre-push", program(PUSH_REFUSAL))
    # git drops GIT_CONFIG_COUNT for the git it starts in another repository (local_repo_env): a push
    # from a clone the agent made into the user's repository runs receive-pack there with the hooks
    # this file names (a repository's own core.hooksPath still wins).
    if bash and git:
        (folder / "hooks-config").write_text(f'[core]\n\thooksPath = {config_quoted(str(folder / "hooks"))}\n')
    (folder / "global-config").write_text(including(users_global_configs()))
    # Read-only: a hook installer run by the agent (`git rev-parse --git-path hooks` names this folder) cannot replace them.
    for sub in ("bin", "hooks", "exec"):
        if (folder / sub).is_dir():
            (folder / sub).chmod(0o555)


def fences_missing(bash: str | None, git: str | None) -> str:
    """Why the git fences cannot keep the agent's commands off the user's repository ("" when they can)."""
    if not git:
        return "no git on PATH"
    if not bash:
        return "no bash on PATH: the git front and hooks are bash scripts"
    try:
        said = subprocess.run([git, "version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    found = re.search(r"(\d+)\.(\d+)", said)
    if found and (int(found.group(1)), int(found.group(2))) < FENCES_NEED_GIT:
        wanted = ".".join(map(str, FENCES_NEED_GIT))
        return f"git {found.group(0)} is older than {wanted}, which reads the fences' settings from the environment: upgrade git"
    return ""


def _remove(folder: Path) -> None:
    for sub in ("bin", "hooks", "exec"):
        try:
            (folder / sub).chmod(0o755)
        except OSError:
            pass
    shutil.rmtree(folder, ignore_errors=True)


def _write_program(path: Path, text: str) -> None:
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    path.chmod(0o555)


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _quoted_words(words: list[str]) -> str:
    return " ".join(map(_quoted, words))


__all__ = [
    "BRANCH_VARIABLE",
    "COMMON_DIR_VARIABLE",
    "FENCES_NEED_GIT",
    "SCREEN_PROGRAMS",
    "Confinement",
    "agent_environment",
    "fences_missing",
    "remove_abandoned_folders",
    # The repository's config put back (orchestrator/shared_config.py), importable from here as before.
    "kept_config",
    "restore_config_copy",
]
