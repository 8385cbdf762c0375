"""Kill a real night with SIGKILL at random points, recover, and check every invariant.

    .venv/bin/python bench/kill.py [--kills 50] [--seed 7] [--old-runs] [--postgres]

Each trial starts a night (3 tasks, a scripted model server with small
delays) in a subprocess, kills its process group at a random moment (during
startup, or anywhere in the night: model calls, tools, checks, commits,
rollbacks, note writes), runs crash recovery the way `overnight run` does
first, and checks: the lock is free, no iteration/task/run is left running,
every worktree is clean at its branch head, no branch lost a commit and every
new commit passes its task's check, notes.md parses, SQLite's integrity_check
is ok. The night is the real `overnight run` (lock, recovery, night), in
its own process group.

--postgres runs the same kills with `[store] url` on a fresh database of a
throwaway PostgreSQL cluster (tests/postgres_cluster.py; exit 2 when its
binaries are missing), integrity_check's place taken by `consistency`:
no orphan row, no invalid index, no leftover transaction, every lease free.

--old-runs kills nights while `[state] keep_runs_days` removes old runs
instead, and checks that whole runs are left: see bench/kill_old_runs.py;
with --postgres, in a PostgreSQL store several state dirs share.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

FILES = {
    "greet.py": "def greet():\n    return 'helo'\n",
    "check_greet.py": "import greet\nassert greet.greet() == 'hello'\n",
    "shout.py": "def shout(s):\n    return s\n",
    "check_shout.py": "import shout\nassert shout.shout('a') == 'A'\n",
    ".gitignore": "*.pyc\n__pycache__/\n",
}
TASKS = [
    {"name": "greet", "prompt": "greet() should return 'hello'.", "check": "python check_greet.py"},
    {"name": "shout", "prompt": "shout() should upper-case.", "check": "python check_shout.py"},
    {"name": "journal", "prompt": "keep a journal.", "check": "test -s log/journal.txt"},
]
DELAY_S = 0.03
FINAL = {"committed", "rolled_back", "cancelled", "interrupted"}
GIT_ENV = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@x"}


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env={**os.environ, **GIT_ENV})
    if done.returncode:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def script(night: int) -> list:
    """Replies for one whole night: greet commits, shout fails once then commits, journal commits."""
    from orchestrator.scripted import call

    def c(name: str, args: dict) -> object:
        return call(name, args, delay_s=DELAY_S)

    stamp = {"path": "log/night.txt", "content": f"night {night}\n"}
    return [
        c("write_file", stamp),
        c("write_file", {"path": "greet.py", "content": "def greet():\n    return 'hello'\n"}),
        c("run_check", {}),
        c("submit", {"summary": f"greet night {night}"}),
        c("write_file", {"path": "shout.py", "content": "def shout(s):\n    return s.lower()\n"}),
        c("write_file", {"path": "junk.pyc", "content": "x"}),
        c("submit", {"summary": "wrong"}),
        c("write_file", {"path": "shout.py", "content": "def shout(s):\n    return s.upper()\n"}),
        c("write_file", stamp),
        c("submit", {"summary": f"shout night {night}"}),
        c("write_file", {"path": "log/journal.txt", "content": f"night {night}\n"}),
        c("submit", {"summary": f"journal night {night}"}),
    ]


def write_config(work: Path, api_base: str, store_url: str | None = None) -> Path:
    """overnight.toml for the trials; the run store is the state dir's SQLite file unless `store_url` is given."""
    lines = [
        "[model]", 'name = "openai/scripted"', f'api_base = "{api_base}"', "request_timeout_s = 10", "retries = 0",
        "", "[repo]", f'path = "{work / "repo"}"', "", "[state]", f'dir = "{work / "state"}"',
        "", "[night]", "max_iterations = 2", "max_turns = 8",
    ]
    if store_url is not None:
        lines += ["", "[store]", f"url = {json.dumps(store_url)}"]
    for task in TASKS:
        lines += ["", "[[task]]", *(f"{k} = {json.dumps(v)}" for k, v in task.items())]
    path = work / "overnight.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


# --- the parent: kill, recover, check ------------------------------------------------------


class Night:
    """A child night whose JSON log events are collected as they arrive."""

    def __init__(self, config: Path) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            # The real CLI; --verbose logs each model and tool call, which tells where a kill landed.
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--log-format", "json", "--verbose"],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )
        self.events: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            try:
                record = json.loads(line)
                event = record["event"] + (f" {record['tool']}" if "tool" in record else "")
            except (ValueError, KeyError, TypeError):
                continue
            self.events.append((time.monotonic() - self.started, event))

    def wait_for(self, event: str, timeout_s: float) -> float | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            for at, name in list(self.events):
                if name == event:
                    return at
            time.sleep(0.01)
        return None

    def wait(self, timeout_s: float = 120) -> int:
        """Its exit code, once it has exited and its last line is read."""
        self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=2)
        return self.proc.returncode

    def kill(self) -> str:
        """SIGKILL the whole process group (git and check children too); the phase it landed in."""
        finished = self.proc.poll() is not None
        if not finished:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._reader.join(timeout=2)
        if finished:
            return "after exit"
        return f"after {self.events[-1][1]}" if self.events else "startup"


def recover(config_path: Path) -> float:
    from orchestrator.config import load_config
    from orchestrator.lock import StateLock
    from orchestrator.logs import get_logger
    from orchestrator.recovery import recover_interrupted
    from runs import RunStore

    config = load_config(config_path)
    began = time.perf_counter()
    with StateLock(config.state_dir):
        store = RunStore.open(config.store_url)
        try:
            recover_interrupted(store, config, get_logger())
        finally:
            store.close()
    return time.perf_counter() - began


def branch_heads(repo: Path) -> dict[str, str]:
    out = git(repo, "for-each-ref", "--format=%(refname:short) %(objectname)", "refs/heads/overnight/")
    return dict(line.split() for line in out.splitlines() if line)


Query = Callable[[str], list[tuple]]


@contextlib.contextmanager
def run_store(state: Path, store_url: str | None) -> Iterator[Query]:
    """A function that answers one SQL statement's rows from the trials' run store: the state dir's runs.db,
    or the PostgreSQL database at `store_url`."""
    if store_url is None:
        import sqlite3

        with contextlib.closing(sqlite3.connect(state / "runs.db")) as db:
            yield lambda statement: db.execute(statement).fetchall()
    else:
        import psycopg

        from tests.postgres_cluster import libpq_url

        with psycopg.connect(libpq_url(store_url), autocommit=True) as db:
            yield lambda statement: db.execute(statement).fetchall()


# Parent tables and the column that names the parent row.
PARENTS = {"task_runs": ("runs", "run_id"), "iterations": ("task_runs", "task_run_id"), "events": ("iterations", "iteration_id")}


def consistency(query: Query) -> list[str]:
    """PostgreSQL's place for SQLite's integrity_check: what is wrong in the store. A row whose parent is gone, an
    index left invalid, a session of the killed night still in a transaction, a lease not freed by recovery (the
    trials' only state dir is the one recovered)."""
    found = []
    for table, (parent, column) in PARENTS.items():
        [(orphans,)] = query(f"SELECT count(*) FROM {table} c LEFT JOIN {parent} p ON c.{column} = p.id WHERE p.id IS NULL")
        if orphans:
            found.append(f"db: {orphans} {table} rows without their {parent} row")
    [(invalid,)] = query("SELECT count(*) FROM pg_index WHERE NOT indisvalid OR NOT indisready OR NOT indislive")
    if invalid:
        found.append(f"db: {invalid} invalid indexes")
    if in_transaction := sessions_in_a_transaction(query):
        found.append(f"db: {in_transaction} sessions left in a transaction")
    if leases := query("SELECT task, owner FROM leases"):
        found.append(f"db: leases not freed: {leases}")
    return found


def sessions_in_a_transaction(query: Query, grace_s: float = 5.0) -> int:
    """How many other sessions of the database are in a transaction, once a killed client's have had `grace_s` to end:
    its backend ends only when it reads the socket's close (a quarter of them are still listed the moment the client
    is reaped, none 50 ms later on a quiet machine; a loaded one may take longer). One that stays is counted."""
    deadline = time.monotonic() + grace_s
    while True:
        [(count,)] = query(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND state LIKE 'idle in transaction%'"
        )
        if not count or time.monotonic() >= deadline:
            return count
        time.sleep(0.05)


def violations(work: Path, before: dict[str, str], store_url: str | None = None) -> list[str]:
    """Every invariant that does not hold after recovery, the run store being runs.db or `store_url`'s database."""
    from orchestrator.lock import StateLock
    from orchestrator.note_format import HEADER
    from orchestrator.notes import NotesBook

    found: list[str] = []
    state, repo = work / "state", work / "repo"
    try:
        with StateLock(state):
            pass
    except Exception as exc:
        found.append(f"lock: {exc}")
    with run_store(state, store_url) as query:
        if store_url is None:
            if query("PRAGMA integrity_check")[0][0] != "ok":
                found.append("db: integrity_check failed")
        else:
            found += consistency(query)
        for (outcome,) in query("SELECT outcome FROM iterations"):
            if outcome not in FINAL:
                found.append(f"db: iteration left {outcome}")
        if query("SELECT count(*) FROM task_runs WHERE outcome = 'running'")[0][0]:
            found.append("db: task run left running")
        if query("SELECT count(*) FROM runs WHERE status = 'running'")[0][0]:
            found.append("db: run left running")
    after = branch_heads(repo)
    for task in TASKS:
        branch = f"overnight/{task['name']}"
        tree = state / "worktrees" / task["name"]
        if tree.exists():
            if git(tree, "status", "--porcelain", "--ignored"):
                found.append(f"{task['name']}: worktree not clean")
            if git(tree, "symbolic-ref", "HEAD") != f"refs/heads/{branch}":
                found.append(f"{task['name']}: worktree not on its branch")
        old, new = before.get(branch), after.get(branch)
        if old and not new:
            found.append(f"{task['name']}: branch lost")
        if not new:
            continue
        if old and subprocess.run(["git", "merge-base", "--is-ancestor", old, new], cwd=repo).returncode:
            found.append(f"{task['name']}: committed work lost ({old[:8]} not in {new[:8]})")
        span = f"{old}..{new}" if old else f"main..{new}"
        for commit in git(repo, "rev-list", span).split():
            if not passes_check(repo, commit, task["check"]):
                found.append(f"{task['name']}: commit {commit[:8]} fails its check")
    notes = state / "notes.md"
    if notes.exists():
        text = notes.read_text(encoding="utf-8")
        headings = [line for line in text.splitlines() if line.startswith("## ")]
        entries = NotesBook(notes).entries()
        if not text.startswith(HEADER.rstrip("\n")) or len(entries) != len(headings):
            found.append("notes: malformed heading")
        if any("**Correction:**" not in e.text or e.text.count("```") % 2 for e in entries):
            found.append("notes: partial entry")
    # Every iteration whose ending writes a note has exactly one (recovery writes what a kill left
    # owed, and only that): notes.md holds each (task, iteration, reason) as often as iterations
    # ended so with their note written. (A parked task's extra entry has no iteration of its own.)
    # TRUE and FALSE: PostgreSQL's booleans do not compare with 1 and 0; SQLite reads them as 1 and 0.
    with run_store(state, store_url) as query:
        if query("SELECT count(*) FROM iterations WHERE note_owed = TRUE")[0][0]:
            found.append("notes: an owed entry left unwritten after recovery")
        noted = Counter(
            query("SELECT t.name, i.number, i.reason FROM iterations i JOIN task_runs t ON i.task_run_id = t.id WHERE i.note_owed = FALSE")
        )
    written = Counter((e.task, e.iteration, e.reason) for e in NotesBook(notes).entries() if e.reason != "parked")
    if written != noted:
        found.append(f"notes: entries and noted iterations differ ({sorted((written - noted) + (noted - written))})")
    if list(state.glob(".notes.md.*.tmp")):
        found.append("notes: temp file left")
    return found


def passes_check(repo: Path, commit: str, check: str) -> bool:
    with tempfile.TemporaryDirectory() as scratch:
        archive = subprocess.run(["git", "archive", commit], cwd=repo, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", scratch], input=archive, check=True)
        return subprocess.run(check, shell=True, cwd=scratch, capture_output=True).returncode == 0


def setup(work: Path) -> None:
    repo = work / "repo"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    for name, text in FILES.items():
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "initial")


def run_trial(
    work: Path, night: int, kill_at: str, startup_s: float, night_s: float, rng: random.Random, night_durations: list[float], store_url: str | None = None
) -> tuple[str, float, list[str]]:
    from orchestrator.fake_server import ScriptedServer

    with ScriptedServer(script(night)) as server:
        config = write_config(work, server.url, store_url)
        before = branch_heads(work / "repo")
        child_night = Night(config)
        if kill_at == "startup":
            time.sleep(rng.uniform(0, startup_s))
        elif (started := child_night.wait_for("night_started", 60)) is not None:
            time.sleep(rng.uniform(0, night_s))
        phase = child_night.kill()
        finished = [at for at, name in child_night.events if name == "night_finished"]
        if kill_at == "night" and finished and started is not None:
            # Nights get faster once the machine is warm: aim within what they take now.
            night_durations.append(finished[0] - started)
    recovery_s = recover(config)
    return phase, recovery_s, violations(work, before, store_url)


def calibrate(work: Path, store_url: str | None = None) -> tuple[float, float]:
    """One whole night, unkilled: how long startup and the night itself take."""
    from orchestrator.fake_server import ScriptedServer

    with ScriptedServer(script(0)) as server:
        night = Night(write_config(work, server.url, store_url))
        started = night.wait_for("night_started", 60) or 0.0
        exit_code = night.wait()
        ended = time.monotonic() - night.started
        if exit_code != 0:
            raise SystemExit(f"calibration night exited {exit_code}; events: {[e for _, e in night.events]}")
    return started, ended - started


def kill_trials(
    work: Path, kills: int, calibration: tuple[float, float], rng: random.Random, startup_share: float, store_url: str | None = None
) -> Iterator[tuple[str, float, list[str]]]:
    """`kills` trials in `work` (set up and calibrated), as each ends: where its kill landed, the recovery's seconds,
    the invariants broken. A share `startup_share` of kills is aimed at startup."""
    startup_s, night_s = calibration
    durations: list[float] = []
    for trial in range(1, kills + 1):
        aim = "startup" if rng.random() < startup_share else "night"
        aim_s = min([night_s, *durations])
        yield run_trial(work, trial, aim, startup_s, aim_s, rng, durations, store_url)


@contextlib.contextmanager
def store_for_the_trials(postgres: bool) -> Iterator[str | None]:
    """None (each state dir's runs.db), or with `postgres` a fresh database's URL on a throwaway cluster; exit 2 with
    one line when the PostgreSQL binaries are missing."""
    if not postgres:
        yield None
        return
    from tests.postgres_cluster import bin_dir, fresh_database, throwaway_cluster

    binaries = bin_dir()
    if binaries is None:
        print("bench/kill.py --postgres: initdb, pg_ctl and postgres not found (on PATH or in /usr/lib/postgresql/<n>/bin)", file=sys.stderr)
        sys.exit(2)
    with throwaway_cluster(binaries) as server, fresh_database(server, prefix="overnight_kill") as url:
        yield url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--startup-share", type=float, default=0.2, help="fraction of kills aimed at startup")
    parser.add_argument("--old-runs", action="store_true", help="kill during [state] keep_runs_days's removal instead (bench/kill_old_runs.py)")
    parser.add_argument("--postgres", action="store_true", help="the run store on a throwaway PostgreSQL cluster (initdb, pg_ctl on PATH)")
    args = parser.parse_args()
    if args.old_runs:
        from bench.kill_old_runs import main as kill_old_runs

        sys.exit(kill_old_runs(args.kills, args.seed, postgres=args.postgres))
    rng = random.Random(args.seed)
    import structlog

    # Recovery's own log lines would drown the table.
    structlog.configure(logger_factory=structlog.ReturnLoggerFactory())
    with store_for_the_trials(args.postgres) as store_url, tempfile.TemporaryDirectory(prefix="overnight-kill-") as scratch:
        work = Path(scratch)
        setup(work)
        calibration = calibrate(work, store_url)
        print("calibration: startup {:.2f} s, night {:.2f} s".format(*calibration))
        phases: Counter[str] = Counter()
        problems: list[str] = []
        recoveries: list[float] = []
        began = time.monotonic()
        trials = kill_trials(work, args.kills, calibration, rng, args.startup_share, store_url)
        for trial, (phase, recovery_s, found) in enumerate(trials, start=1):
            phases[phase] += 1
            recoveries.append(recovery_s)
            problems += [f"kill {trial} ({phase}): {p}" for p in found]
            print(f"  kill {trial:3d}  {phase:26s} recovery {recovery_s * 1000:6.0f} ms  {'OK' if not found else found}", flush=True)
        elapsed = time.monotonic() - began
        print()
        print("| kills | violations | recovery median | recovery max | wall |")
        print("|------:|-----------:|----------------:|-------------:|-----:|")
        print(f"| {args.kills} | {len(problems)} | {statistics.median(recoveries) * 1000:.0f} ms | {max(recoveries) * 1000:.0f} ms | {elapsed:.0f} s |")
        print()
        print("| phase (last log event before the kill) | kills |")
        print("|---|---:|")
        for phase, count in phases.most_common():
            print(f"| {phase} | {count} |")
        for problem in problems:
            print("VIOLATION", problem)
        sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
