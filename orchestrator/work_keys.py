"""What names a task's work among the workers (state dirs) that may share a run store: whether the store is shared,
the repository's key, and the work's key."""

from __future__ import annotations

import hashlib
from typing import Any

from orchestrator.config import Config, TaskConfig
from orchestrator.repository import open_repo
from runs.engine import sqlite_files


def store_is_shared(config: Config) -> bool:
    """Whether other state dirs may share the run store: any but the default one, a SQLite file in the state dir,
    which is this state dir's alone."""
    return not any(file.is_relative_to(config.state_dir) for file in sqlite_files(config.store_url))


def shared_repository_key(config: Config, repo: Any = None) -> str:
    """repository_key in a store other state dirs may share; "" in this state dir's own (each task's start is
    spared asking). `repo`: the user's git.Repo, opened here only when needed if not given."""
    if not store_is_shared(config):
        return ""
    return repository_key(repo if repo is not None else open_repo(config.repo_path), config.repo.base)


def repository_key(repo: Any, base: str) -> str:
    """The repository's root commits below `base`: the same in every clone of it, and in no other repository."""
    return " ".join(sorted(repo.git.rev_list("--max-parents=0", base).split()))


def work_key(repository: str, task: TaskConfig) -> str:
    """A task's work across the workers sharing a store: its repository, name, prompt and check."""
    return hashlib.sha256("\0".join((repository, task.name, task.prompt, task.check)).encode()).hexdigest()[:32]
