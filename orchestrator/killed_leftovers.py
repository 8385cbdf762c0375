"""What a killed night left that no row of the run store names, cleared before recovery settles anything.

First of the steps: a check or agent command the night started runs in a session of its own, so it
outlives a `kill -9` and would go on writing into a worktree while it is rolled back, or into the git
config as it is put back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.config import Config
from orchestrator.confinement import remove_abandoned_folders
from orchestrator.errors import StateError
from orchestrator.marked_processes import stop_marked_processes
from orchestrator.shared_config import restore_config_copy
from orchestrator.state_files import GIT_CONFIG_COPY


def clear_a_killed_nights_leftovers(config: Config, log: Any) -> None:
    """What a killed night left besides its records: half-written temporary files, its commands still
    running, the git config its agent changed, the folders of its fences in /tmp."""
    _remove_stale_temp_files(config.state_dir, log)
    _stop_orphan_commands(config.worktrees_dir, log)  # before any worktree is rolled back under them
    # After the commands that may have changed it are stopped: the config a killed night's agent changed.
    restored = restore_config_copy(config.git_config_copy)
    if restored:
        log.warning("git_config_restored", path=restored)
    for folder in remove_abandoned_folders():
        log.info("agent_folder_removed", path=str(folder))


def _stop_orphan_commands(worktrees_dir: Path, log: Any) -> None:
    """Checks and agent commands a killed night started: each runs in its own session, so it
    outlives the night, and would go on writing into a worktree that is being rolled back
    (its files then committed by the next night). Found by the mark in their environment
    (orchestrator.command_environment.COMMAND_MARK); Linux's /proc, elsewhere nothing to do."""
    for group, worktree in stop_marked_processes(worktrees_dir.resolve(), below=True).items():
        # The group is the command's: it ran in a session of its own, led by the shell overnight started.
        log.warning("orphan_command_stopped", pid=group, worktree=worktree)


def _remove_stale_temp_files(state_dir: Path, log: Any) -> None:
    """notes.md's and the git config copy's half-written temporary files: never renamed into place, so only debris."""
    for temporary in [*state_dir.glob(".notes.md.*.tmp"), *state_dir.glob(f".{GIT_CONFIG_COPY}.*.tmp")]:
        if temporary.is_dir() and not temporary.is_symlink():
            continue  # a folder so named is nobody's debris of ours (we write plain files): left as it is
        try:
            temporary.unlink(missing_ok=True)
        except OSError as exc:  # a state dir this user may not write in: one line (exit 4), not a traceback
            raise StateError(f"cannot remove {temporary}: {exc.strerror or exc}") from None
        log.info("temp_file_removed", path=str(temporary))
