"""A whole-project `search` on a big repository, next to `git grep` on the same files.

    python bench/search.py [tracked_files]      (default 20000; about a minute)

A real git repository (~20,000 small tracked files in 400 folders, as bench/big_repo.py makes),
300 untracked files, a 5,000-file `.venv` (skipped) and an ignored 5,000-file `build/`. Each
pattern is searched from the top five times through a real Toolbox; the table shows the median
and the fastest, and `git grep` on the same pattern as the floor (it searches fewer files: not
the untracked ones, and in its own regex dialect). Absolute times move with the host.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.records import ToolCall  # noqa: E402
from orchestrator.tools import Toolbox  # noqa: E402
from tests.conftest import git  # noqa: E402

PATTERNS = {
    "plain text, one match": "NEEDLE = 1",
    "plain text, no match": "no_such_text_anywhere",
    "regex, one line matches": r"return 19999\b",
    "regex, 100+ matches": r"def f\d+7\(\)",
}
RUNS = 5


def make_repo(path: Path, tracked: int) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    for i in range(tracked):
        folder = path / "src" / f"d{i // 50 // 20}" / f"m{i // 50}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i}.py").write_text(f"def f{i}():\n    return {i}  # value\n")
    (path / "target.py").write_text("NEEDLE = 1\n")
    (path / ".gitignore").write_text("build/\n__pycache__/\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    for top in (".venv", "build"):
        for i in range(5000):
            folder = path / top / f"pkg{i // 100}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"m{i}.py").write_text(f"x = {i}\nNEEDLE = 1\n")
    for i in range(300):
        (path / "src" / f"new{i}.py").write_text("pass\n")
    return path


def timed(action) -> list[float]:
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    tracked = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        repo = make_repo(Path(tmp) / "repo", tracked)
        box = Toolbox(repo, ["search"], check_command="true")
        print(f"{'pattern':28} {'search median':>14} {'fastest':>8} {'git grep median':>16}")
        for label, pattern in PATTERNS.items():
            ours = timed(lambda: box.execute(ToolCall("search", {"pattern": pattern, "path": "."})))
            grep = timed(lambda: subprocess.run(["git", "grep", "-P", pattern], cwd=repo, stdout=subprocess.DEVNULL))
            print(f"{label:28} {statistics.median(ours):13.3f}s {min(ours):7.3f}s {statistics.median(grep):15.3f}s")


if __name__ == "__main__":
    main()
