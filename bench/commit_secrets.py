"""The cost of a passing iteration's commit with and without the search for `pass_env` values.

    .venv/bin/python bench/commit_secrets.py [rounds]

A 2,000-file repository; each round changes what an agent's fix does (3 files modified, 1 new) and
commits it with `Worktree.commit(onto=checkpoint)`: without `secrets` (every task without `pass_env`),
with them and nothing to find, and with a `.env` the check wrote the value into (put back), interleaved
round by round; then a 20 MB new file, without and with them. Prints the median and fastest of each, and the
medians' ratio to the first.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.rollback import git  # noqa: E402
from orchestrator.passed_secrets import passed_secrets  # noqa: E402
from orchestrator.worktree import Worktree  # noqa: E402

PASSWORD = "Db-Pass-0123456789xyz"
SECRETS = passed_secrets(["DB_PASSWORD"], {"DB_PASSWORD": PASSWORD})


def make_repo(path: Path, files: int) -> None:
    for index in range(files):
        target = path / f"pkg{index % 50}" / f"module_{index}.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"VALUE = {index}\n" * 20)
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "init")


def agents_fix(tree: Path, round_: int) -> None:
    for index in range(3):
        (tree / f"pkg{index}" / f"module_{index}.py").write_text(f"VALUE = {round_}\n" * 20)
    (tree / f"new_{round_}.py").write_text(f"NEW = {round_}\n")


def leaky_check(tree: Path, round_: int) -> None:
    agents_fix(tree, round_)
    (tree / ".env").write_text(f"DB_PASSWORD={PASSWORD}\n")


def large_output(tree: Path, round_: int) -> None:
    agents_fix(tree, round_)
    (tree / f"dump_{round_}.bin").write_bytes(os.urandom(20 << 20))


def timed_commit(tree: Worktree, round_: int, change: Callable[[Path, int], None], secrets) -> float:
    change(tree.path, round_)
    checkpoint = tree.checkpoint()
    started = time.perf_counter()
    tree.commit(f"round {round_}", onto=checkpoint, secrets=secrets)
    return time.perf_counter() - started


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 41
    with tempfile.TemporaryDirectory() as scratch:
        repo, state = Path(scratch) / "repo", Path(scratch) / "state"
        make_repo(repo, 2000)
        tree = Worktree.ensure(repo, state, "bench", "main")
        cases = [
            ("no pass_env (secrets=None)", agents_fix, None),
            ("pass_env, nothing found", agents_fix, SECRETS),
            ("pass_env, .env put back", leaky_check, SECRETS),
        ]
        # Interleaved, round by round: the machine's load drifts alike for each.
        times: dict[str, list[float]] = {label: [] for label, _, _ in cases}
        for round_ in range(rounds):
            for index, (label, change, secrets) in enumerate(cases):
                times[label].append(timed_commit(tree, round_ * len(cases) + index, change, secrets))  # a new file each time
        # A new 20 MB file: git's add (hashing, compressing) dominates; the search reads it back once.
        for label, secrets in (("no pass_env, + 20 MB new file", None), ("pass_env, + 20 MB new file", SECRETS)):
            times[label] = []
        for round_ in range(5):
            for index, (label, secrets) in enumerate((("no pass_env, + 20 MB new file", None), ("pass_env, + 20 MB new file", SECRETS))):
                times[label].append(timed_commit(tree, 10_000 + 2 * round_ + index, large_output, secrets))
        baseline = statistics.median(times[cases[0][0]])
        print(f"{'commit':<30} {'n':>4} {'median ms':>10} {'fastest ms':>11} {'ratio':>6}")
        for label, taken in times.items():
            median = statistics.median(taken)
            print(f"{label:<30} {len(taken):>4} {median * 1000:>10.1f} {min(taken) * 1000:>11.1f} {median / baseline:>6.2f}")


if __name__ == "__main__":
    main()
