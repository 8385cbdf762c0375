"""What a person may have written in a task's worktree, kept on a branch of its own before recovery
cleans the worktree or rolls it back: `git branch --list 'overnight-kept/*'`.
"""

from __future__ import annotations

from typing import Any

from orchestrator.config import Config
from orchestrator.passed_secrets import PassedSecrets, passed_secrets
from orchestrator.records import KeptOutOfCommit
from orchestrator.redactor import Redactor
from orchestrator.task_branches import kept_branch
from orchestrator.worktree import Worktree


def keep_what_a_person_may_have_written(worktree: Worktree, task: str, config: Config, log: Any, onto: str | None = None) -> None:
    """Changes in a worktree no iteration was running in are not the agent's: most likely a person's
    (the morning's review, edited where git lets the task branch be checked out). They are kept on
    a branch of their own before the worktree is cleaned for the night.

    A night killed after a check given `pass_env` wrote a passed value into a file (a `.env`, a log) and
    before the commit left that file there too: kept, it would reach a branch a person may push. It is
    left off the kept branch as an iteration's commit leaves it off the task's (`secret_kept_out_of_commit`); so are the
    agent's own commits above `onto` (what the worktree is rolled back to) when they hold one, folded in."""
    branch = kept_branch(task)
    message = f"Changes found in overnight's worktree of task {task} with no iteration running, kept before it was cleaned"
    # When they cannot be kept (StateError), cleaning would lose them: the night stops (exit 4), everything as it is.
    kept = worktree.keep_changes(
        branch, message, secrets=_passed_secrets_of(config, task), on_kept_out=lambda out: _log_kept_out(config, task, out, log), onto=onto,
    )
    if kept is not None:
        log.warning("worktree_changes_kept", task=task, branch=branch)


def _passed_secrets_of(config: Config, task: str) -> PassedSecrets | None:
    """The values the task's check gets through `pass_env`, read from this environment as the check would get
    them; None when it gets none. A task no longer in the config (removed, renamed) has no pass_env to read: any
    configured task's value may be what its last check wrote, so all of theirs are looked for."""
    configured = [each.pass_env for each in config.task if each.name == task] or [each.pass_env for each in config.task]
    names = sorted({name for pass_env in configured for name in pass_env})
    return passed_secrets(names) if names else None


def _log_kept_out(config: Config, task: str, kept: KeptOutOfCommit, log: Any) -> None:
    """`secret_kept_out_of_commit`, each path through the night's redaction (orchestrator/night_state.py): a file may
    be named after the value."""
    redact = Redactor.for_config(config)
    log.warning("secret_kept_out_of_commit", task=task, paths=[redact(path) for path in kept.paths], names=list(kept.names))
