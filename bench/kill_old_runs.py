"""Kill a real night with SIGKILL while `[state] keep_runs_days` removes old runs; check that only whole runs are left.

    .venv/bin/python bench/kill.py --old-runs [--postgres] [--kills 50] [--seed 7]

Before each kill, OLD_RUNS ended runs of the state dir are seeded, long past `keep_runs_days = 1`: copies of the run
tests/test_keep_runs.py's `a_run` records, grown to TASK_RUNS task runs of ITERATIONS iterations of EVENTS events each.
A real `overnight run` starts in its own process group; an old transcript makes it log `transcripts_removed` right
before the removal begins, and the group is killed at a random moment within the time `RunStore.remove_old_runs` took
over the same rows, timed in this process first. Then: each old run of the state dir is whole (its rows as seeded) or
gone, no row has lost its parent, SQLite's integrity_check is ok; and the next night removes the rest, keeps a recent
run and other state dirs', and exits 0. tests/test_keep_runs_kill.py runs a few such kills.

With `--postgres` the store is a database of a throwaway PostgreSQL cluster, shared as machines share one: the seeded
task runs carry WORKS works, some finished with success (a task run `succeeded`, an iteration `committed`) at times
apart, and two other state dirs' old runs hold the newest finish of some of them. Each kill must also leave every run
that held a work's newest finish before it (runs/old_runs.py keeps those), the next night must remove every other old
run of the state dir, and integrity_check's place is taken by bench/kill.py's `consistency` (an index left invalid,
a session of the killed night left in a transaction).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sqlite3
import sys
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from bench.kill import Night, consistency, store_for_the_trials  # noqa: E402
from orchestrator.lock import state_identity  # noqa: E402
from runs import RunStore  # noqa: E402
from runs.engine import sqlite_database_file, sqlite_url  # noqa: E402
from runs.old_runs import RUNS_PER_BATCH  # noqa: E402
from tests.conftest import SAMPLE_FILES, make_repo, write_config  # noqa: E402
from tests.postgres_cluster import libpq_url  # noqa: E402
from tests.test_keep_runs import OTHER_STATE_DIR, a_run, store_file  # noqa: E402
from tests.test_night import FIX  # noqa: E402

# A night's shape (4 tasks, 3 iterations each, 15 turns of a model call and a tool call), 600 times: 30 batches,
# 0.3-0.7 s to remove on the 2-vCPU build machine, by the hour.
OLD_RUNS = 600
TASK_RUNS = 4
ITERATIONS = 3
EVENTS = 30  # a multiple of the 3 events a_run records
# In a shared store (--postgres): the works the seeded task runs do, a third of them `succeeded`, a fifth of their
# iterations `committed`; the first THEIRS of them finished last by another state dir (two: OTHERS).
WORKS = 40
THEIRS = 8
OTHERS = (OTHER_STATE_DIR, "fedcba9876543210fedcba9876543210")
NO_ROWS = {"runs": 0, "task_runs": 0, "iterations": 0, "events": 0}
# Each table below its parent, and the column that names the parent.
_TABLES = ("runs", "task_runs", "iterations", "events")
_PARENT = {"task_runs": "run_id", "iterations": "task_run_id", "events": "iteration_id"}
# One statement on the run store, `?` its placeholders, and its rows (see _store).
Query = Callable[..., list[tuple]]


@dataclass(frozen=True)
class Setup:
    """A state dir under `keep_runs_days = 1`, its run store at `store_url`, with runs that must stay: `template`
    (another state dir's, old: what the old runs are copied from), a recent one of its own, and in a shared store a
    third state dir's old run; `kept` holds their rows."""

    config: Path
    server: Any
    state_id: str
    template: int
    kept: dict[int, dict[str, int]]
    store_url: str

    @property
    def shared(self) -> bool:
        """Whether the store is one machines share (PostgreSQL), where the newest finish of each work stays."""
        return not self.store_url.startswith("sqlite")


@dataclass(frozen=True)
class Landing:
    """Where a kill landed: `removed` of the `removable` old runs were gone after it; `logged` whether `runs_removed`
    (logged once the removal is over) came before it."""

    removed: int
    removable: int
    logged: bool

    @property
    def inside(self) -> bool:
        """The kill came after `transcripts_removed` and before the removal was over."""
        return not self.logged and self.removed < self.removable

    def phase(self) -> str:
        """The batch (its transaction, or just before it) the kill landed in; batches commit whole."""
        return f"in batch {self.removed // RUNS_PER_BATCH + 1}" if self.inside else "after the removal"


def set_up(folder: Path, server: Any, store_url: str | None = None) -> Setup:
    """A repository, a config for `server` with `keep_runs_days = 1` (and `keep_transcripts_days = 1`: its line
    marks the removal's start), its run store at `store_url` (None: the state dir's runs.db), and the runs that stay."""
    repo = make_repo(folder / "repo", SAMPLE_FILES)
    config = write_config(
        folder / "overnight.toml", api_base=server.url, repo=repo, state={"keep_runs_days": 1, "keep_transcripts_days": 1},
        extra="" if store_url is None else f"\n[store]\nurl = {json.dumps(store_url)}\n",
    )
    (config.parent / "state").mkdir()
    store_url = store_url or sqlite_url(store_file(config))
    template = a_run(config, state_id=OTHER_STATE_DIR, url=store_url)
    state_id = state_identity(config.parent / "state")
    recent = a_run(config, state_id=state_id, url=store_url)
    with _store(store_url) as query:
        _age(query, template, began_days_ago=10, ended_days_ago=9)
        _age(query, recent, began_days_ago=0.6, ended_days_ago=0.5)
        for top, size in (("events", EVENTS // 3), ("iterations", ITERATIONS), ("task_runs", TASK_RUNS)):
            _copy_rows(query, template, top, copies=size - 1)
        stay = [template, recent]
        if not store_url.startswith("sqlite"):
            stay.append(_theirs_finished_last(query, template))
    kept = rows_by_run(store_url)
    return Setup(config, server, state_id, template, {run_id: kept[run_id] for run_id in stay}, store_url)


def _theirs_finished_last(query: Query, template: int) -> int:
    """In a shared store: the other state dirs' old runs (the template, and a copy of it as a third state dir's) finish
    the first THEIRS works with success, the template's task runs eight days ago, the copy's iterations committed
    then: later than any seeded run. The copy's id."""
    third = _copy_rows(query, template, "runs", copies=1)
    query("UPDATE runs SET state_id = ? WHERE id = ?", OTHERS[1], third)
    for run_id, first_work, outcome in ((template, 0, "succeeded"), (third, THEIRS // 2, "failed")):
        task_runs = query("SELECT id FROM task_runs WHERE run_id = ? ORDER BY id", run_id)
        for work, (task_run,) in enumerate(task_runs[: THEIRS // 2], start=first_work):
            query("UPDATE task_runs SET work_key = ?, outcome = ?, finished_at = ? WHERE id = ?", f"work-{work}", outcome, _days_ago(8, True), task_run)
        if outcome == "failed":
            ids = ", ".join(str(task_run) for (task_run,) in task_runs[: THEIRS // 2])
            query(f"UPDATE iterations SET outcome = 'committed', finished_at = ? WHERE task_run_id IN ({ids})", _days_ago(8, True))
    return third


def seed_old_runs(setup: Setup) -> dict[int, dict[str, int]]:
    """OLD_RUNS copies of the template as this state dir's runs, ended 9 days ago (in a shared store, their works and
    finishes set: see WORKS): the rows by run of every old run of the state dir, these and any an earlier night kept."""
    with _store(setup.store_url) as query:
        first = _copy_rows(query, setup.template, "runs", copies=OLD_RUNS)
        last = first + OLD_RUNS - 1
        query(f"UPDATE runs SET state_id = ? WHERE id BETWEEN {first} AND {last}", setup.state_id)
        if setup.shared:
            _finish_works(query, first, last)
        mine = {run_id for (run_id,) in query("SELECT id FROM runs WHERE state_id = ?", setup.state_id)}
    return {run_id: rows for run_id, rows in rows_by_run(setup.store_url, begun_days_ago=1).items() if run_id in mine}


def _finish_works(query: Query, first: int, last: int) -> None:
    """The task runs of runs `first` to `last` (PostgreSQL) do WORKS works; a third of them `succeeded`, a fifth of
    their iterations `committed`, each a millisecond per id past 9 days ago (copies made later, later; all of them
    before the other state dirs' finishes, 8 days ago)."""
    task_runs = f"SELECT id FROM task_runs WHERE run_id BETWEEN {first} AND {last}"
    ended = _days_ago(9, True)
    query(
        "UPDATE task_runs SET work_key = 'work-' || mod(id, ?), finished_at = ? + id * interval '1 millisecond', "
        f"outcome = CASE WHEN mod(id, 3) = 0 THEN 'succeeded' ELSE 'failed' END WHERE id IN ({task_runs})",
        WORKS, ended,
    )
    query(
        "UPDATE iterations SET finished_at = ? + id * interval '1 millisecond', "
        f"outcome = CASE WHEN mod(id, 5) = 0 THEN 'committed' ELSE outcome END WHERE task_run_id IN ({task_runs})",
        ended,
    )


def newest_finishes(store_url: str) -> set[int]:
    """The runs holding, for each work, its newest finish with success (a task run `succeeded`, an iteration
    `committed`); read here, apart from runs/old_runs.py's query."""
    with _store(store_url) as query:
        finishes = query("SELECT work_key, run_id, finished_at FROM task_runs WHERE work_key IS NOT NULL AND outcome = 'succeeded'")
        finishes += query(
            "SELECT t.work_key, t.run_id, i.finished_at FROM iterations i JOIN task_runs t ON i.task_run_id = t.id "
            "WHERE t.work_key IS NOT NULL AND i.outcome = 'committed'"
        )
    newest: dict[str, Any] = {}
    for work, _, at in finishes:
        newest[work] = max(newest.get(work, at), at)
    return {run_id for work, run_id, at in finishes if at == newest[work]}


def kept_as_newest(setup: Setup, seeded: dict[int, dict[str, int]]) -> set[int]:
    """The `seeded` runs the removal must leave in a shared store, holding a work's newest finish; none in the state
    dir's own."""
    return newest_finishes(setup.store_url) & seeded.keys() if setup.shared else set()


def _copy_rows(query: Query, run_id: int, top: str, *, copies: int) -> int:
    """`copies` copies of run `run_id`'s rows of table `top`, each with all the rows below it: a copied run is a new
    run, a copied task run, iteration or event belongs to the same parent. The first copy's id."""
    below = _TABLES[_TABLES.index(top):]
    # Copy k of a row of table t gets the id base + (id - low + 1) + (k - 1) * span: above every id, and apart.
    ids = {table: query(f"SELECT min(id), max(id) - min(id) + 1 FROM ({_ids_of(table, run_id)}) AS ids")[0] for table in below}
    bases = {table: query(f"SELECT max(id) FROM {table}")[0][0] for table in below}

    def new_id(table: str, column: str) -> str:
        low, span = ids[table]
        return f'{bases[table]} + ("{column}" - {low} + 1) + (k - 1) * {span}'

    def value(table: str, column: str) -> str:
        if column == "id":
            return new_id(table, column)
        if column == _PARENT.get(table) and table != top:  # the parent's copy k
            return new_id(_TABLES[_TABLES.index(table) - 1], column)
        return f'"{column}"'  # quoted: `commit` is a keyword

    postgres = not query.sqlite  # type: ignore[attr-defined]
    for table in below:
        if postgres:
            columns = [name for (name,) in query("SELECT column_name FROM information_schema.columns WHERE table_name = ? ORDER BY ordinal_position", table)]
        else:
            columns = [row[1] for row in query(f"PRAGMA table_info({table})")]
        quoted = [f'"{column}"' for column in columns]
        values = [value(table, column) for column in columns]
        query(
            f"WITH RECURSIVE copy(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM copy WHERE k < {copies}) "
            f"INSERT INTO {table} ({', '.join(quoted)}) "
            f"SELECT {', '.join(values)} FROM {table}, copy WHERE id IN ({_ids_of(table, run_id)})"
        )
        if postgres:  # ids given, not drawn: the night's own rows draw theirs after these
            query(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
    return bases[top] + 1



@contextlib.contextmanager
def _store(store_url: str) -> Iterator[Query]:
    """A function running one statement (`?` its placeholders) on the run store at `store_url` and answering its rows:
    SQLite's file, committed and closed at the end, or PostgreSQL's database, each statement committed. Its `sqlite`
    says which."""
    if store_url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(sqlite_database_file(store_url))) as db, db:
            sqlite_query: Any = lambda statement, *params: db.execute(statement, params).fetchall()  # noqa: E731
            sqlite_query.sqlite = True
            yield sqlite_query
        return
    import psycopg

    with psycopg.connect(libpq_url(store_url), autocommit=True) as connection:

        def postgres_query(statement: str, *params: Any) -> list[tuple]:
            # No parameters, no placeholders: a statement's own `%` (LIKE 'idle%') stays as written.
            cursor = connection.execute(statement.replace("?", "%s"), params or None)
            return cursor.fetchall() if cursor.description else []

        postgres_query.sqlite = False  # type: ignore[attr-defined]
        yield postgres_query


def _days_ago(days: float, postgres: bool) -> Any:
    """That many days ago, as the store keeps times: an aware datetime for PostgreSQL, SQLite's UTC text."""
    moment = datetime.now(timezone.utc) - timedelta(days=days)
    return moment if postgres else moment.replace(tzinfo=None).strftime("%Y-%m-%d %H:%M:%S.%f")


def _age(query: Query, run_id: int, *, began_days_ago: float, ended_days_ago: float) -> None:
    """Move a run, its tasks, iterations and events back in time: begun and ended that many days ago."""
    postgres = not query.sqlite  # type: ignore[attr-defined]
    began, ended = _days_ago(began_days_ago, postgres), _days_ago(ended_days_ago, postgres)
    tasks = "SELECT id FROM task_runs WHERE run_id = ?"
    query("UPDATE runs SET started_at = ?, finished_at = ? WHERE id = ?", began, ended, run_id)
    query("UPDATE task_runs SET started_at = ?, finished_at = ? WHERE run_id = ?", began, ended, run_id)
    query(f"UPDATE iterations SET started_at = ?, heartbeat_at = ?, finished_at = ? WHERE task_run_id IN ({tasks})", began, began, ended, run_id)
    query(f"UPDATE events SET at = ? WHERE iteration_id IN (SELECT id FROM iterations WHERE task_run_id IN ({tasks}))", began, run_id)


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


def rows_by_run(store_url: str, *, begun_days_ago: float = 0) -> dict[int, dict[str, int]]:
    """The rows of every run begun more than `begun_days_ago` days ago, as tests/test_keep_runs.py's `rows_of` counts
    them, in four queries. (A night's own run can take the id of a removed one: SQLite reuses the highest.)"""
    with _store(store_url) as query:
        begun_before = _days_ago(begun_days_ago, not query.sqlite)  # type: ignore[attr-defined]
        found = {run_id: {**NO_ROWS, "runs": 1} for (run_id,) in query("SELECT id FROM runs WHERE started_at < ?", begun_before)}
        for table, statement in (
            ("task_runs", "SELECT run_id, count(*) FROM task_runs GROUP BY run_id"),
            ("iterations", "SELECT t.run_id, count(*) FROM iterations i JOIN task_runs t ON i.task_run_id = t.id GROUP BY t.run_id"),
            (
                "events",
                "SELECT t.run_id, count(*) FROM events e JOIN iterations i ON e.iteration_id = i.id "
                "JOIN task_runs t ON i.task_run_id = t.id GROUP BY t.run_id",
            ),
        ):
            for run_id, count in query(statement):
                if run_id in found:  # rows whose run is gone are orphans: `torn_runs` counts those
                    found[run_id][table] = count
    return found


def torn_runs(store_url: str, seeded: dict[int, dict[str, int]], holders: set[int] = frozenset()) -> list[str]:  # type: ignore[assignment]
    """What is wrong with the store after a kill: a `seeded` run neither whole nor gone, one of `holders` (runs that
    held a work's newest finish) gone, a row whose parent is gone, a failed integrity check (PostgreSQL: bench/kill.py's
    `consistency` but its leases, which the next night's recovery frees)."""
    now = rows_by_run(store_url, begun_days_ago=1)
    found = [f"run {run_id} torn: {now[run_id]}, seeded {whole}" for run_id, whole in seeded.items() if now.get(run_id, whole) != whole]
    found += [f"run {run_id}, the newest finish of a work, removed" for run_id in sorted(holders - now.keys())]
    with _store(store_url) as query:
        if not query.sqlite:  # type: ignore[attr-defined]
            return found + [problem for problem in consistency(query) if not problem.startswith("db: leases")]
        for table, parent_table in zip(_TABLES[1:], _TABLES):
            column = _PARENT[table]
            orphans = query(f"SELECT count(*) FROM {table} c LEFT JOIN {parent_table} p ON c.{column} = p.id WHERE p.id IS NULL")[0][0]
            if orphans:
                found.append(f"{orphans} {table} rows without their {parent_table} row")
        found += [f"foreign_key_check: {row}" for row in query("PRAGMA foreign_key_check")]
        integrity = [row[0] for row in query("PRAGMA integrity_check")]
    return found + ([] if integrity == ["ok"] else [f"integrity_check: {integrity}"])


def rest_removed(setup: Setup, holders: set[int] = frozenset()) -> list[str]:  # type: ignore[assignment]
    """What is wrong after the night that follows a kill: an old run of this state dir left but those of `holders`
    (which held a work's newest finish before it), a kept run changed, a torn store."""
    old = rows_by_run(setup.store_url, begun_days_ago=1)
    found = [f"old run {run_id} left: {rows}" for run_id, rows in old.items() if run_id not in setup.kept and run_id not in holders]
    now = rows_by_run(setup.store_url)
    found += [f"kept run {run_id} changed: {now.get(run_id, NO_ROWS)}, was {rows}" for run_id, rows in setup.kept.items() if now.get(run_id) != rows]
    return found + torn_runs(setup.store_url, {}, holders)


def leave_an_old_transcript(config: Path) -> None:
    """A transcript 10 days old: `transcripts_removed`, logged right before the runs' removal, says it begins."""
    folder = config.parent / "state" / "transcripts"
    folder.mkdir(parents=True, exist_ok=True)
    transcript = folder / "task-run-1-old-1.jsonl"  # named as overnight names its own: another .jsonl is left alone
    transcript.write_text("{}\n")
    ten_days_ago = time.time() - 10 * 86400
    os.utime(transcript, (ten_days_ago, ten_days_ago))


def removal_time(setup: Setup) -> float:
    """Seconds `RunStore.remove_old_runs` (what `overnight run` calls) takes to remove freshly seeded old runs."""
    seed_old_runs(setup)
    store = RunStore.open(setup.store_url)
    try:
        began = time.perf_counter()
        for _ in store.remove_old_runs(setup.state_id, timedelta(days=1), shared=setup.shared):  # as the night's
            pass
        return time.perf_counter() - began
    finally:
        store.close()


def kill_in_removal(setup: Setup, seeded: dict[int, dict[str, int]], within_s: float, rng: random.Random) -> tuple[Landing, list[str]]:
    """Start a real `overnight run` over the `seeded` old runs, SIGKILL its process group `uniform(0, within_s)` seconds
    after it logs `transcripts_removed`, and check the store: where the kill landed, and what `torn_runs` finds (the
    runs holding a work's newest finish before the night among what must be left)."""
    holders = kept_as_newest(setup, seeded)
    removable = len(seeded.keys() - holders)
    leave_an_old_transcript(setup.config)
    night = Night(setup.config)
    if night.wait_for("transcripts_removed", 60) is None:
        night.kill()
        return Landing(0, removable, logged=False), [f"no transcripts_removed; events {[name for _, name in night.events]}"]
    time.sleep(rng.uniform(0, within_s))
    night.kill()
    left = rows_by_run(setup.store_url, begun_days_ago=1)
    removed = sum(run_id not in left for run_id in seeded)
    landing = Landing(removed, removable, logged=any(name == "runs_removed" for _, name in night.events))
    return landing, torn_runs(setup.store_url, seeded, holders)


def next_night(setup: Setup) -> int:
    """A real `overnight run`, unkilled, that fixes greet(): its exit code."""
    setup.server.enqueue(*FIX)
    return Night(setup.config).wait()


def main(kills: int, seed: int, postgres: bool = False) -> int:
    """bench/kill.py --old-runs [--postgres]: `kills` kills, a line each, then the table; 1 when an invariant was broken."""
    import tempfile

    from orchestrator.fake_server import ScriptedServer

    rng = random.Random(seed)
    with (
        store_for_the_trials(postgres) as store_url,
        tempfile.TemporaryDirectory(prefix="overnight-kill-old-runs-") as scratch,
        ScriptedServer() as server,
    ):
        setup = set_up(Path(scratch), server, store_url)
        within_s, problems = removal_time(setup), []
        print(f"calibration: {OLD_RUNS} old runs of {setup.kept[setup.template]} removed in {within_s:.2f} s")
        phases: Counter[str] = Counter()
        torn_kills = kept_total = 0
        began = time.monotonic()
        for trial in range(1, kills + 1):
            seeded = seed_old_runs(setup)
            holders = kept_as_newest(setup, seeded)
            landing, found = kill_in_removal(setup, seeded, within_s, rng)
            exit_code = next_night(setup)
            found += ([] if exit_code == 0 else [f"next night exited {exit_code}"]) + rest_removed(setup, holders)
            phases[landing.phase()] += 1
            torn_kills += bool(found)
            kept_total += len(holders)
            problems += [f"kill {trial} ({landing.phase()}): {problem}" for problem in found]
            verdict = f"{len(found)} violations, the first: {found[0]}" if found else "OK"
            print(f"  kill {trial:3d}  {landing.phase():17s} {landing.removed:3d}/{landing.removable} gone, {len(holders)} kept  {verdict}", flush=True)
        print()
        print("| kills | inside the removal | kills with a violation | removal | newest finishes kept | wall |")
        print("|------:|-------------------:|-----------------------:|--------:|---------------------:|-----:|")
        inside = kills - phases["after the removal"]
        print(f"| {kills} | {inside} | {torn_kills} | {within_s:.2f} s | {kept_total} | {time.monotonic() - began:.0f} s |")
        print()
        print("| where the kill landed | kills |")
        print("|---|---:|")
        for phase, count in sorted(phases.items(), key=lambda item: (len(item[0]), item[0])):
            print(f"| {phase} | {count} |")
        for problem in problems:
            print("VIOLATION", problem)
    return 1 if problems else 0
