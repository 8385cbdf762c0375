"""Kill a real night with SIGKILL while `[state] keep_runs_days` removes old runs; check that only whole runs are left.

    .venv/bin/python bench/kill.py --old-runs [--kills 50] [--seed 7]

Before each kill, OLD_RUNS ended runs of the state dir are seeded, long past `keep_runs_days = 1`: copies of the run
tests/test_keep_runs.py's `a_run` records, grown to TASK_RUNS task runs of ITERATIONS iterations of EVENTS events each.
A real `overnight run` starts in its own process group; an old transcript makes it log `transcripts_removed` right
before the removal begins, and the group is killed at a random moment within the time `RunStore.remove_old_runs` took
over the same rows, timed in this process first. Then: each seeded run is whole (its rows as seeded) or gone, no row
has lost its parent, SQLite's integrity_check is ok; and the next night removes the rest, keeps a recent run and
another state dir's, and exits 0. tests/test_keep_runs_kill.py runs a few such kills.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import sys
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from bench.kill import Night  # noqa: E402
from orchestrator.lock import state_identity  # noqa: E402
from runs import RunStore  # noqa: E402
from runs.old_runs import RUNS_PER_BATCH  # noqa: E402
from tests.conftest import SAMPLE_FILES, make_repo, write_config  # noqa: E402
from tests.test_keep_runs import OTHER_STATE_DIR, a_run, age, store_file  # noqa: E402
from tests.test_night import FIX  # noqa: E402

# A night's shape (4 tasks, 3 iterations each, 15 turns of a model call and a tool call), 600 times: 30 batches,
# 0.3-0.7 s to remove on the 2-vCPU build machine, by the hour.
OLD_RUNS = 600
TASK_RUNS = 4
ITERATIONS = 3
EVENTS = 30  # a multiple of the 3 events a_run records
NO_ROWS = {"runs": 0, "task_runs": 0, "iterations": 0, "events": 0}
# Each table below its parent, and the column that names the parent.
_TABLES = ("runs", "task_runs", "iterations", "events")
_PARENT = {"task_runs": "run_id", "iterations": "task_run_id", "events": "iteration_id"}


@dataclass(frozen=True)
class Setup:
    """A state dir under `keep_runs_days = 1` with two runs that must stay: `template` (another state dir's, old:
    what the old runs are copied from) and a recent one of its own; `kept` holds their rows."""

    config: Path
    server: Any
    state_id: str
    template: int
    kept: dict[int, dict[str, int]]


@dataclass(frozen=True)
class Landing:
    """Where a kill landed: `removed` of the `seeded` runs were gone after it; `logged` whether `runs_removed`
    (logged once the removal is over) came before it."""

    removed: int
    seeded: int
    logged: bool

    @property
    def inside(self) -> bool:
        """The kill came after `transcripts_removed` and before the removal was over."""
        return not self.logged and self.removed < self.seeded

    def phase(self) -> str:
        """The batch (its transaction, or just before it) the kill landed in; batches commit whole."""
        return f"in batch {self.removed // RUNS_PER_BATCH + 1}" if self.inside else "after the removal"


def set_up(folder: Path, server: Any) -> Setup:
    """A repository, a config for `server` with `keep_runs_days = 1` (and `keep_transcripts_days = 1`: its line
    marks the removal's start) and the two runs that stay."""
    repo = make_repo(folder / "repo", SAMPLE_FILES)
    config = write_config(
        folder / "overnight.toml", api_base=server.url, repo=repo, state={"keep_runs_days": 1, "keep_transcripts_days": 1}
    )
    (config.parent / "state").mkdir()
    template = a_run(config, state_id=OTHER_STATE_DIR)
    age(config, template, began_days_ago=10, ended_days_ago=9)
    state_id = state_identity(config.parent / "state")
    recent = a_run(config, state_id=state_id)
    age(config, recent, began_days_ago=0.6, ended_days_ago=0.5)
    with _store(config) as db:
        for top, size in (("events", EVENTS // 3), ("iterations", ITERATIONS), ("task_runs", TASK_RUNS)):
            _copy_rows(db, template, top, copies=size - 1)
    kept = rows_by_run(config)
    return Setup(config, server, state_id, template, {run_id: kept[run_id] for run_id in (template, recent)})


def seed_old_runs(setup: Setup) -> dict[int, dict[str, int]]:
    """OLD_RUNS copies of the template as this state dir's runs, ended 9 days ago: their rows by run."""
    with _store(setup.config) as db:
        first = _copy_rows(db, setup.template, "runs", copies=OLD_RUNS)
        seeded = range(first, first + OLD_RUNS)
        db.execute(f"UPDATE runs SET state_id = ? WHERE id BETWEEN {seeded[0]} AND {seeded[-1]}", (setup.state_id,))
    whole = setup.kept[setup.template]
    return {run_id: whole for run_id in seeded}


def _copy_rows(db: sqlite3.Connection, run_id: int, top: str, *, copies: int) -> int:
    """`copies` copies of run `run_id`'s rows of table `top`, each with all the rows below it: a copied run is a new
    run, a copied task run, iteration or event belongs to the same parent. The first copy's id."""
    below = _TABLES[_TABLES.index(top):]
    # Copy k of a row of table t gets the id base + (id - low + 1) + (k - 1) * span: above every id, and apart.
    ids = {table: db.execute(f"SELECT min(id), max(id) - min(id) + 1 FROM ({_ids_of(table, run_id)})").fetchone() for table in below}
    bases = {table: db.execute(f"SELECT max(id) FROM {table}").fetchone()[0] for table in below}

    def new_id(table: str, column: str) -> str:
        low, span = ids[table]
        return f'{bases[table]} + ("{column}" - {low} + 1) + (k - 1) * {span}'

    def value(table: str, column: str) -> str:
        if column == "id":
            return new_id(table, column)
        if column == _PARENT.get(table) and table != top:  # the parent's copy k
            return new_id(_TABLES[_TABLES.index(table) - 1], column)
        return f'"{column}"'  # quoted: `commit` is a keyword

    for table in below:
        columns = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
        quoted = [f'"{column}"' for column in columns]
        values = [value(table, column) for column in columns]
        db.execute(
            f"WITH RECURSIVE copy(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM copy WHERE k < {copies}) "
            f"INSERT INTO {table} ({', '.join(quoted)}) "
            f"SELECT {', '.join(values)} FROM {table}, copy WHERE id IN ({_ids_of(table, run_id)})"
        )
    return bases[top] + 1


@contextlib.contextmanager
def _store(config: Path) -> Iterator[sqlite3.Connection]:
    """The store's SQLite file, committed and closed at the end (`with sqlite3.connect()` only commits)."""
    with contextlib.closing(sqlite3.connect(store_file(config))) as db, db:
        yield db


def _ids_of(table: str, run_id: int) -> str:
    """A query for the ids of run `run_id`'s rows in `table`."""
    task_runs = f"SELECT id FROM task_runs WHERE run_id = {int(run_id)}"
    iterations = f"SELECT id FROM iterations WHERE task_run_id IN ({task_runs})"
    return {
        "runs": f"SELECT {int(run_id)} AS id",
        "task_runs": task_runs,
        "iterations": iterations,
        "events": f"SELECT id FROM events WHERE iteration_id IN ({iterations})",
    }[table]


def rows_by_run(config: Path, *, begun_days_ago: float = 0) -> dict[int, dict[str, int]]:
    """The rows of every run begun more than `begun_days_ago` days ago, as tests/test_keep_runs.py's `rows_of` counts
    them, in four queries. (A night's own run can take the id of a removed one: SQLite reuses the highest.)"""
    begun_before = (datetime.now(timezone.utc) - timedelta(days=begun_days_ago)).strftime("%Y-%m-%d %H:%M:%S.%f")
    with _store(config) as db:
        found = {run_id: {**NO_ROWS, "runs": 1} for (run_id,) in db.execute("SELECT id FROM runs WHERE started_at < ?", (begun_before,))}
        for table, query in (
            ("task_runs", "SELECT run_id, count(*) FROM task_runs GROUP BY run_id"),
            ("iterations", "SELECT t.run_id, count(*) FROM iterations i JOIN task_runs t ON i.task_run_id = t.id GROUP BY t.run_id"),
            (
                "events",
                "SELECT t.run_id, count(*) FROM events e JOIN iterations i ON e.iteration_id = i.id "
                "JOIN task_runs t ON i.task_run_id = t.id GROUP BY t.run_id",
            ),
        ):
            for run_id, count in db.execute(query):
                if run_id in found:  # rows whose run is gone are orphans: `torn_runs` counts those
                    found[run_id][table] = count
    return found


def torn_runs(config: Path, seeded: dict[int, dict[str, int]]) -> list[str]:
    """What is wrong with the store after a kill: a `seeded` run neither whole nor gone, a row whose parent is gone,
    a failed integrity check."""
    now = rows_by_run(config, begun_days_ago=1)
    found = [f"run {run_id} torn: {now[run_id]}, seeded {whole}" for run_id, whole in seeded.items() if now.get(run_id, whole) != whole]
    with _store(config) as db:
        for table, parent_table in zip(_TABLES[1:], _TABLES):
            column = _PARENT[table]
            orphans = db.execute(f"SELECT count(*) FROM {table} c LEFT JOIN {parent_table} p ON c.{column} = p.id WHERE p.id IS NULL").fetchone()[0]
            if orphans:
                found.append(f"{orphans} {table} rows without their {parent_table} row")
        found += [f"foreign_key_check: {row}" for row in db.execute("PRAGMA foreign_key_check")]
        integrity = [row[0] for row in db.execute("PRAGMA integrity_check")]
    return found + ([] if integrity == ["ok"] else [f"integrity_check: {integrity}"])


def rest_removed(setup: Setup) -> list[str]:
    """What is wrong after the night that follows a kill: an old run of this state dir left, a kept run changed, a torn
    store."""
    old = rows_by_run(setup.config, begun_days_ago=1)
    found = [f"old run {run_id} left: {rows}" for run_id, rows in old.items() if run_id not in setup.kept]
    now = rows_by_run(setup.config)
    found += [f"kept run {run_id} changed: {now.get(run_id, NO_ROWS)}, was {rows}" for run_id, rows in setup.kept.items() if now.get(run_id) != rows]
    return found + torn_runs(setup.config, {})


def leave_an_old_transcript(config: Path) -> None:
    """A transcript 10 days old: `transcripts_removed`, logged right before the runs' removal, says it begins."""
    folder = config.parent / "state" / "transcripts"
    folder.mkdir(parents=True, exist_ok=True)
    transcript = folder / "old.jsonl"
    transcript.write_text("{}\n")
    ten_days_ago = time.time() - 10 * 86400
    os.utime(transcript, (ten_days_ago, ten_days_ago))


def removal_time(setup: Setup) -> float:
    """Seconds `RunStore.remove_old_runs` (what `overnight run` calls) takes to remove freshly seeded old runs."""
    seed_old_runs(setup)
    store = RunStore.open(f"sqlite:///{store_file(setup.config)}")
    try:
        began = time.perf_counter()
        for _ in store.remove_old_runs(setup.state_id, timedelta(days=1), shared=False):  # the state dir's own store, as the night's
            pass
        return time.perf_counter() - began
    finally:
        store.close()


def kill_in_removal(setup: Setup, seeded: dict[int, dict[str, int]], within_s: float, rng: random.Random) -> tuple[Landing, list[str]]:
    """Start a real `overnight run` over the `seeded` old runs, SIGKILL its process group `uniform(0, within_s)` seconds
    after it logs `transcripts_removed`, and check the store: where the kill landed, and what `torn_runs` finds."""
    leave_an_old_transcript(setup.config)
    night = Night(setup.config)
    if night.wait_for("transcripts_removed", 60) is None:
        night.kill()
        return Landing(0, len(seeded), logged=False), [f"no transcripts_removed; events {[name for _, name in night.events]}"]
    time.sleep(rng.uniform(0, within_s))
    night.kill()
    left = rows_by_run(setup.config, begun_days_ago=1)
    landing = Landing(sum(run_id not in left for run_id in seeded), len(seeded), logged=any(name == "runs_removed" for _, name in night.events))
    return landing, torn_runs(setup.config, seeded)


def next_night(setup: Setup) -> int:
    """A real `overnight run`, unkilled, that fixes greet(): its exit code."""
    setup.server.enqueue(*FIX)
    return Night(setup.config).wait()


def main(kills: int, seed: int) -> int:
    """bench/kill.py --old-runs: `kills` kills, a line each, then the table; 1 when an invariant was broken."""
    import tempfile

    from orchestrator.fake_server import ScriptedServer

    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="overnight-kill-old-runs-") as scratch, ScriptedServer() as server:
        setup = set_up(Path(scratch), server)
        within_s, problems = removal_time(setup), []
        print(f"calibration: {OLD_RUNS} old runs of {setup.kept[setup.template]} removed in {within_s:.2f} s")
        phases: Counter[str] = Counter()
        torn_kills = 0
        began = time.monotonic()
        for trial in range(1, kills + 1):
            seeded = seed_old_runs(setup)
            landing, found = kill_in_removal(setup, seeded, within_s, rng)
            exit_code = next_night(setup)
            found += ([] if exit_code == 0 else [f"next night exited {exit_code}"]) + rest_removed(setup)
            phases[landing.phase()] += 1
            torn_kills += bool(found)
            problems += [f"kill {trial} ({landing.phase()}): {problem}" for problem in found]
            verdict = f"{len(found)} violations, the first: {found[0]}" if found else "OK"
            print(f"  kill {trial:3d}  {landing.phase():17s} {landing.removed:3d}/{landing.seeded} gone  {verdict}", flush=True)
        print()
        print("| kills | inside the removal | kills with a violation | removal | wall |")
        print("|------:|-------------------:|-----------------------:|--------:|-----:|")
        inside = kills - phases["after the removal"]
        print(f"| {kills} | {inside} | {torn_kills} | {within_s:.2f} s | {time.monotonic() - began:.0f} s |")
        print()
        print("| where the kill landed | kills |")
        print("|---|---:|")
        for phase, count in sorted(phases.items(), key=lambda item: (len(item[0]), item[0])):
            print(f"| {phase} | {count} |")
        for problem in problems:
            print("VIOLATION", problem)
    return 1 if problems else 0
