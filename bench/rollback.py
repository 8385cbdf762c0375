"""Rolling a worktree back to its checkpoint versus re-creating it, on repositories of 5k and 20k files.

    .venv/bin/python bench/rollback.py

Each round dirties the task worktree the way a failed iteration does (50 files
modified, 50 new, 10 deleted, an ignored build folder) and then either rolls
it back (`Worktree.rollback`: reset --hard + clean -ffdx) or removes and
re-adds the worktree. Prints the median of each and their ratio.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.worktree import Worktree  # noqa: E402

ENV = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@x"}
ROUNDS = 5


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, env=ENV, check=True, capture_output=True)


def make_repo(path: Path, files: int) -> None:
    for index in range(files):
        target = path / f"pkg{index % 100}" / f"module_{index}.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"VALUE = {index}\n" * 20)
    (path / ".gitignore").write_text("build/\n")
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "init")


def dirty(tree: Path) -> None:
    for index in range(50):
        (tree / f"pkg{index}" / f"module_{index}.py").write_text("changed\n")
        (tree / f"new_{index}.py").write_text("new\n")
    for index in range(50, 60):
        (tree / f"pkg{index}" / f"module_{index}.py").unlink()
    build = tree / "build"
    build.mkdir(exist_ok=True)
    for index in range(200):
        (build / f"obj_{index}.o").write_bytes(b"\0" * 512)


def measure(files: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as scratch:
        repo, state = Path(scratch) / "repo", Path(scratch) / "state"
        repo.mkdir()
        make_repo(repo, files)
        worktree = Worktree.ensure(repo, state, "task", "main")
        checkpoint = worktree.checkpoint()
        rollbacks, recreations = [], []
        for _ in range(ROUNDS):
            dirty(worktree.path)
            started = time.perf_counter()
            worktree.rollback(checkpoint)
            rollbacks.append(time.perf_counter() - started)
            assert worktree.idle_state() == "clean"
        for _ in range(ROUNDS):
            dirty(worktree.path)
            started = time.perf_counter()
            git(repo, "worktree", "remove", "--force", str(worktree.path))
            shutil.rmtree(worktree.path, ignore_errors=True)
            worktree = Worktree.ensure(repo, state, "task", "main")
            recreations.append(time.perf_counter() - started)
        return statistics.median(rollbacks), statistics.median(recreations)


def main() -> int:
    print(f"{'files':>6}  {'rollback ms':>11}  {'re-create ms':>12}  {'re-create / rollback':>20}")
    for files in (5_000, 20_000):
        rollback, recreate = measure(files)
        print(f"{files:>6}  {rollback * 1000:>11.0f}  {recreate * 1000:>12.0f}  {recreate / rollback:>19.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
