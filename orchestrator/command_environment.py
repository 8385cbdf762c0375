"""The environment a command overnight runs gets: nothing in it waits for a person, and git stays in the worktree.

Every process overnight starts (its own git, the check, the agent's commands) begins from base_environment;
the commands also get the unattended settings, the worktree's git config and identity, the command mark and
the git ceilings (command_environment).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Collection, Mapping

from orchestrator.secrecy import without_secrets

# In the environment of every process overnight starts (its own git too): nothing may wait for a person.
UNATTENDED_ENV = {
    "GIT_TERMINAL_PROMPT": "0",
    # git asks an askpass program before it looks at GIT_TERMINAL_PROMPT: GIT_ASKPASS, then
    # core.askPass, then SSH_ASKPASS (VS Code's terminal and KDE set them). Set and empty, it
    # turns all three off; ssh's own use of SSH_ASKPASS goes with SSH_ASKPASS_REQUIRE=never.
    "GIT_ASKPASS": "",
    "SSH_ASKPASS_REQUIRE": "never",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
    # `git commit` without -m, `git rebase -i`, crontab -e: an editor would wait forever.
    # (GIT_SEQUENCE_EDITOR too: a user's `sequence.editor` setting outranks GIT_EDITOR.)
    "GIT_EDITOR": "true",
    "GIT_SEQUENCE_EDITOR": "true",
    "EDITOR": "true",
    "VISUAL": "true",
}
# Who commits in the agent's worktrees, whatever the user's git identity is.
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "overnight",
    "GIT_AUTHOR_EMAIL": "overnight@localhost",
    "GIT_COMMITTER_NAME": "overnight",
    "GIT_COMMITTER_EMAIL": "overnight@localhost",
}
# How git runs in the agent's worktrees, whatever the user's git config says (through the
# environment: git >= 2.31; the user's own git commands are untouched). Overnight's own git
# and every command run there (the agent's own `git commit` too) get it:
WORKTREE_GIT_CONFIG = {
    # no `git maintenance run --auto` after each commit (a process, and 3 ms, per commit);
    "maintenance.auto": "false",
    # commits not signed: they are the agent's, not the user's, and gpg would fail (no key
    # for "overnight") or wait for a passphrase nobody types;
    "commit.gpgsign": "false",
    # none of the user's hooks (--no-verify skips only pre-commit and commit-msg): a
    # prepare-commit-msg that opens an editor, a post-commit that pushes, would run unattended;
    "core.hooksPath": os.devnull,
    # no file-system monitor hook or daemon started for each task's worktree.
    "core.fsmonitor": "false",
}
WORKTREE_GIT_ENV = {
    "GIT_CONFIG_COUNT": str(len(WORKTREE_GIT_CONFIG)),
    **{f"GIT_CONFIG_KEY_{i}": key for i, key in enumerate(WORKTREE_GIT_CONFIG)},
    **{f"GIT_CONFIG_VALUE_{i}": value for i, value in enumerate(WORKTREE_GIT_CONFIG.values())},
}
# Git's variables that send every git run to one repository, index, object store or namespace, or
# add settings: inherited by overnight (started from a git hook, or a shell whose dotfiles export
# GIT_DIR), they would lead the agent's git, the check's and overnight's own to the user's
# repository instead of the worktree's. Dropped from all their environments (base_environment).
INHERITED_GIT_VARIABLES = (
    "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_NAMESPACE", "GIT_COMMON_DIR", "GIT_PREFIX", "GIT_CONFIG_PARAMETERS",
)
# Set in every command's environment to the folder it runs in (inherited by all it starts).
COMMAND_MARK = "OVERNIGHT_WORKTREE"


def command_environment(cwd: Path, extra_env: Mapping[str, str] | None, pass_env: Collection[str]) -> dict[str, str]:
    """What a command run in `cwd` gets: overnight's environment without its secret-named variables
    (but `pass_env`), with the settings of an unattended, worktree-bound git, the command mark, and
    `extra_env` on top."""
    # The mark lets the next night's recovery find (and stop) a command a killed night left running.
    env = {
        **without_secrets(base_environment(), pass_env), **UNATTENDED_ENV, **WORKTREE_GIT_ENV, **GIT_IDENTITY,
        COMMAND_MARK: str(cwd), "GIT_CEILING_DIRECTORIES": git_ceilings(cwd),
    }
    env.update(extra_env or {})
    return env


def worktree_git_environment() -> dict[str, str]:
    """What overnight's own git gets when it works in a task's worktree or repository: the base environment,
    unattended, with the worktree's git config (no identity, no mark: those are the agent's commands')."""
    return {**base_environment(), **UNATTENDED_ENV, **WORKTREE_GIT_ENV}


def base_environment() -> dict[str, str]:
    """overnight's environment without INHERITED_GIT_VARIABLES: what its commands and its git start from."""
    env = dict(os.environ)
    for name in INHERITED_GIT_VARIABLES:
        env.pop(name, None)
    return env


def git_ceilings(folder: Path) -> str:
    """GIT_CEILING_DIRECTORIES for commands run in `folder`: every folder above it.

    A ceiling stops git climbing into it, not out of it, so each one above counts: a git run
    in a worktree whose .git link the agent deleted, or after a `cd ..` out of the worktree
    (into the state dir, which may sit in the user's checkout), finds no repository rather than
    the user's checkout. Git still finds the repository of the folder it runs in, and climbs
    in any folder that is not above `folder` (a repository the agent made for itself).
    The leading empty entry: the paths are resolved already, git need not stat them again.
    """
    above = [path for path in Path(folder).resolve().parents if path != path.parent][:_CEILINGS]
    return os.pathsep.join(["", *(str(path) for path in above)])


# The nearest folders above a worktree (the state dir, the user's checkout, a home kept in git) are
# what matters; a path hundreds of folders deep made a variable too long for exec (E2BIG).
_CEILINGS = 32
