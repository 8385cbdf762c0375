"""What each step of a night costs on a big repository, side by side with a 10-file one.

    python bench/big_repo.py [tracked_files]      (default 20000; several minutes)

A real git repository (~20,000 tracked files in 400 folders), a check that makes a `.venv` of
5,000 files (under `[repo] keep`, not in .gitignore) and an ignored `build/` of 5,000 files,
and real nights against the scripted server: iteration 1 lists, searches, writes and edits,
then fails its check (rollback); iteration 2 passes (commit). Then a second night (worktree
reused, recovery, idle-state check), a night killed mid-iteration and recovered, and gc.
Steps are timed by wrapping the project's methods with time.perf_counter (measurement only).
Absolute times move with the host; read the two columns against each other.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.fake_server import ScriptedServer  # noqa: E402
from orchestrator.scripted import call  # noqa: E402
from tests.conftest import git, write_config  # noqa: E402
from tests.test_night import overnight as run_cli  # noqa: E402 - the real CLI in-process, as the tests run it

TIMES: dict[str, list[float]] = defaultdict(list)


def timed(owner, name: str, label: str) -> None:
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            TIMES[label].append(time.perf_counter() - start)

    setattr(owner, name, wrapper)


def instrument() -> None:
    from orchestrator import gc, recovery, tools, worktree

    timed(worktree.Worktree, "ensure", "worktree.ensure")
    timed(worktree.Worktree, "checkpoint", "checkpoint")
    timed(worktree.Worktree, "rollback", "rollback")
    timed(worktree.Worktree, "commit", "commit")
    timed(worktree.Worktree, "idle_state", "idle_state")
    timed(worktree.Worktree, "keep_changes", "keep_changes")
    timed(worktree.Worktree, "run_check", "run_check (incl. the check itself)")
    timed(tools.Toolbox, "_search", "tool search .")
    timed(tools.Toolbox, "_list_dir", "tool list_dir .")
    timed(tools.Toolbox, "_write_file", "tool write_file")
    timed(tools.Toolbox, "_edit_file", "tool edit_file")
    timed(recovery, "recover_interrupted", "recover_interrupted")
    timed(gc, "collect_garbage", "gc.collect_garbage")


MAKE_ENV = textwrap.dedent(
    """\
    import os, sys, time
    start = time.perf_counter()
    made = 0
    for top, count in ((".venv", 5000), ("build", 5000)):
        if os.path.isdir(top):
            continue
        for i in range(count):
            folder = os.path.join(top, f"pkg{i // 100}")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"m{i}.py"), "w") as f:
                f.write(f"x = {i}\\n")
        made += count
    with open(os.environ.get("MEASURE_LOG", "/dev/null"), "a") as log:
        log.write(f"make_env made={made} {time.perf_counter() - start:.3f}\\n")
    """
)

CHECK = "python make_env.py && python -c \"import sys; sys.exit(0 if open('answer.txt').read().strip() == 'right' else 1)\""


def make_repo(path: Path, tracked: int) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    per_folder = 50
    for i in range(tracked):
        folder = path / "src" / f"d{i // per_folder // 20}" / f"m{i // per_folder}" if tracked > 10 else path
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i}.py").write_text(f"def f{i}():\n    return {i}  # value\n")
    (path / "make_env.py").write_text(MAKE_ENV)
    (path / "answer.txt").write_text("none\n")
    (path / "target.py").write_text("NEEDLE = 1\n")
    (path / ".gitignore").write_text("build/\n__pycache__/\n")
    git(path, "add", "-A")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"}
    subprocess.run(["git", "commit", "-q", "-m", "initial"], cwd=path, env=env, check=True)
    return path


def iteration_script(answer: str, n: int) -> list:
    return [
        call("list_dir", {"path": "."}),
        call("search", {"pattern": "NEEDLE", "path": "."}),
        call("write_file", {"path": f"new_{n}.py", "content": "print('new')\n"}),
        call("edit_file", {"path": "target.py", "old": "NEEDLE = 1", "new": f"NEEDLE = {n + 1}"}),
        call("write_file", {"path": "answer.txt", "content": answer + "\n"}),
        call("submit", {"summary": f"answer {answer}"}),
    ]


def night(config: Path, server: ScriptedServer, replies: list, label: str) -> None:
    server.enqueue(*replies)
    start = time.perf_counter()
    code = run_cli("run", "--config", str(config), "--log-format", "json")
    TIMES[f"NIGHT {label} (exit {code})"].append(time.perf_counter() - start)


def killed_night(config: Path, server: ScriptedServer) -> None:
    """A night in a subprocess, killed -9 while its model call hangs; the next night recovers it."""
    from orchestrator.scripted import Reply

    server.enqueue(call("write_file", {"path": "half.py", "content": "x\n"}), Reply(text="late", delay_s=30))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--log-format", "json"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    half = config.parent / "state" / "worktrees" / "task" / "half.py"
    deadline = time.monotonic() + 120
    while not half.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(31)  # the delayed reply ends, so the server is free for the next night


def main() -> None:
    tracked = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    instrument()
    import structlog

    results = {}
    for label, count in (("small", 10), ("big", tracked)):
        TIMES.clear()
        structlog.reset_defaults()
        with tempfile.TemporaryDirectory(prefix=f"measure-{label}-") as tmp, ScriptedServer() as server:
            root = Path(tmp)
            start = time.perf_counter()
            repo = make_repo(root / "repo", count)
            TIMES["setup repo"].append(time.perf_counter() - start)
            os.environ["MEASURE_LOG"] = str(root / "make_env.log")
            config = write_config(
                root / "overnight.toml", api_base=server.url, repo=repo,
                tasks=[{"name": "task", "prompt": "do it", "check": CHECK}],
                night={"max_iterations": 2, "max_turns": 10, "check_timeout_s": 600},
                extra="",
            )
            text = config.read_text().replace("[repo]\n", "[repo]\nkeep = [\".venv\"]\n")
            config.write_text(text)
            night(config, server, iteration_script("wrong", 1) + iteration_script("right", 2), "1 (first; fail+pass)")
            night(config, server, iteration_script("wrong", 3) + iteration_script("right", 4), "2 (reuse; fail+pass)")
            killed_night(config, server)
            night(config, server, iteration_script("right", 5), "3 (after kill -9)")
            config.write_text(config.read_text().replace('name = "task"', 'name = "other"'))
            start = time.perf_counter()
            code = run_cli("gc", "--config", str(config), "--force")
            TIMES[f"gc --force (exit {code})"].append(time.perf_counter() - start)
            TIMES["make_env log"] = []
            results[label] = (dict(TIMES), (root / "make_env.log").read_text() if (root / "make_env.log").exists() else "")
    keys = list(dict.fromkeys(k for t, _ in results.values() for k in t))
    print(f"{'step':42} {'small: n  total  max':>24} {'big: n  total  max':>24}")
    for key in keys:
        row = []
        for label in ("small", "big"):
            values = results[label][0].get(key, [])
            row.append(f"{len(values):3d} {sum(values):7.3f} {max(values, default=0):6.3f}")
        print(f"{key:42} {row[0]:>24} {row[1]:>24}")
    for label in ("small", "big"):
        print(f"make_env runs ({label}):", results[label][1].replace("\n", "; "))


if __name__ == "__main__":
    main()
