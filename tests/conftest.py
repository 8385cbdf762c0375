"""Shared fixtures: real git repositories, a scripted model server on 127.0.0.1, config files."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test User",
    "GIT_AUTHOR_EMAIL": "user@example.com",
    "GIT_COMMITTER_NAME": "Test User",
    "GIT_COMMITTER_EMAIL": "user@example.com",
}


def git(repo: Path, *args: str) -> str:
    result = subprocess.run(
        ["git", *args], cwd=repo, env={**os.environ, **GIT_ENV}, capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


def make_repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    for name, content in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(content))
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


SAMPLE_FILES = {
    "greet.py": "def greet():\n    return 'helo'\n",
    "check_greet.py": "import greet\nassert greet.greet() == 'hello', greet.greet()\nprint('ok')\n",
    ".gitignore": "*.pyc\n__pycache__/\n",
}


@pytest.fixture(autouse=True)
def fresh_logging() -> Iterator[None]:
    """Each test starts with structlog's defaults, never a stream a previous test closed."""
    import structlog

    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A real git repository with one small bug (greet() misspells 'hello')."""
    return make_repo(tmp_path / "repo", SAMPLE_FILES)


@pytest.fixture
def server() -> Iterator[Any]:
    """A scripted OpenAI-compatible server on 127.0.0.1 that real litellm talks to."""
    from orchestrator.fake_server import ScriptedServer

    with ScriptedServer() as running:
        yield running


def write_config(
    path: Path,
    *,
    api_base: str,
    repo: Path,
    tasks: list[dict[str, Any]] | None = None,
    model: dict[str, Any] | None = None,
    night: dict[str, Any] | None = None,
    guards: dict[str, Any] | None = None,
    extra: str = "",
) -> Path:
    """An overnight.toml pointing at `api_base`; fast timeouts, no retry backoff."""
    model = {"name": "openai/scripted", "api_base": api_base, "request_timeout_s": 5, "retries": 1, "retry_backoff_s": 0, **(model or {})}
    night = {"max_iterations": 2, "max_turns": 8, **(night or {})}
    tasks = tasks or [{"name": "fix-greet", "prompt": "greet() should return 'hello'.", "check": "python check_greet.py"}]
    lines = ["[model]", *_pairs(model), "", "[repo]", f"path = {_toml(str(repo))}", "", "[state]", 'dir = "state"', "", "[night]", *_pairs(night)]
    if guards:
        lines += ["", "[guards]", *_pairs(guards)]
    for task in tasks:
        lines += ["", "[[task]]", *_pairs(task)]
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


def _pairs(values: dict[str, Any]) -> list[str]:
    return [f"{key} = {_toml(value)}" for key, value in values.items()]


def _toml(value: Any) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value) if isinstance(value, str) else str(value)


@pytest.fixture
def config_file(tmp_path: Path, repo: Path, server: Any) -> Callable[..., Path]:
    """Write overnight.toml in tmp_path for `repo` and `server`; keyword arguments override sections."""

    def write(**overrides: Any) -> Path:
        return write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, **overrides)

    return write


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen]:
    """A live process that is not an overnight run."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()
