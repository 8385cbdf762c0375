"""`[state] keep_runs_days`: each `overnight run` removes its state dir's runs that ended longer ago, with all their rows."""

from __future__ import annotations

import socket
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from git import Repo

from orchestrator.config import load_config
from orchestrator.leases import lease_key
from orchestrator.lock import state_identity
from orchestrator.work_keys import repository_key, work_key
from runs import RunStore
from tests.conftest import write_config
from tests.test_cli import assert_one_line_error
from tests.test_cli import overnight as overnight_process
from tests.test_faults import dead_pid, recover
from tests.test_logs import _json_run, _one
from tests.test_night import FIX, overnight, report_json
from tests.test_shared_store import HOLDER, clone, held_by_another_machine, killed_while_it_waits, shared_config

OTHER_STATE_DIR = "0123456789abcdef0123456789abcdef"
API_KEY = "sk-keep-runs-Zq8v1xW3kP0rT6yB"


def store_file(config: Path) -> Path:
    return config.parent / "state" / "runs.db"


def a_run(config: Path, *, state_id: str | None, host: str | None = None, running: bool = False, url: str | None = None) -> int:
    """A run recorded in `config`'s store (the store at `url`, when given) as another night leaves one: a task, an
    iteration, a model call, a tool call and a signal; ended (`failed`) unless `running`. Its id."""
    store = RunStore.open(url or f"sqlite:///{store_file(config)}")
    try:
        run_id = store.begin_run(config_path=str(config), pid=dead_pid(), host=host or socket.gethostname(), state_id=state_id)
        if running:
            return run_id
        task_run = store.begin_task(run_id, name="old-task", branch="overnight/old-task")
        iteration = store.begin_iteration(task_run, number=1, checkpoint="0" * 40, pid=dead_pid())
        store.record_model_call(iteration, prompt_tokens=5, completion_tokens=5, latency_ms=3)
        store.record_tool_call(iteration, name="read_file", ok=True, message="x = 1")
        store.record_signal(iteration, level="warning", kind="repeat", message="the same call again")
        store.finish_iteration(iteration, outcome="rolled_back", reason="check_failed")
        store.finish_task(task_run, outcome="failed", reason="check_failed")
        store.finish_run(run_id, status="finished", exit_code=1)
        return run_id
    finally:
        store.close()


def age(config: Path, run_id: int, *, began_days_ago: float, ended_days_ago: float | None, store: Path | None = None) -> None:
    """Move a run, its tasks, iterations and events back in time: begun and ended that many days ago. `store`: a shared
    SQLite file, when `config`'s run store is not its state dir's."""

    def days_ago(days: float) -> str:
        return (datetime.now(timezone.utc) - timedelta(days=days)).replace(tzinfo=None).strftime("%Y-%m-%d %H:%M:%S.%f")

    began = days_ago(began_days_ago)
    ended = days_ago(ended_days_ago) if ended_days_ago is not None else None
    tasks = "SELECT id FROM task_runs WHERE run_id = ?"
    with sqlite3.connect(store or store_file(config)) as db:
        db.execute("UPDATE runs SET started_at = ?, finished_at = coalesce(?, finished_at) WHERE id = ?", (began, ended, run_id))
        db.execute("UPDATE task_runs SET started_at = ?, finished_at = coalesce(?, finished_at) WHERE run_id = ?", (began, ended, run_id))
        db.execute(
            f"UPDATE iterations SET started_at = ?, heartbeat_at = ?, finished_at = coalesce(?, finished_at) WHERE task_run_id IN ({tasks})",
            (began, began, ended, run_id),
        )
        db.execute(
            f"UPDATE events SET at = ? WHERE iteration_id IN (SELECT id FROM iterations WHERE task_run_id IN ({tasks}))", (began, run_id)
        )


def rows_of(config: Path, run_id: int) -> dict[str, int]:
    """How many rows of each table belong to run `run_id`."""
    tasks = "SELECT id FROM task_runs WHERE run_id = ?"
    iterations = f"SELECT id FROM iterations WHERE task_run_id IN ({tasks})"
    with sqlite3.connect(store_file(config)) as db:
        return {
            "runs": db.execute("SELECT count(*) FROM runs WHERE id = ?", (run_id,)).fetchone()[0],
            "task_runs": db.execute(f"SELECT count(*) FROM ({tasks})", (run_id,)).fetchone()[0],
            "iterations": db.execute(f"SELECT count(*) FROM ({iterations})", (run_id,)).fetchone()[0],
            "events": db.execute(f"SELECT count(*) FROM events WHERE iteration_id IN ({iterations})", (run_id,)).fetchone()[0],
        }


def a_first_night(config: Path, server: Any) -> int:
    """A real night that commits fix-greet; its run id."""
    server.enqueue(*FIX)
    assert overnight("run", "--config", str(config)) == 0
    with sqlite3.connect(store_file(config)) as db:
        return db.execute("SELECT max(id) FROM runs").fetchone()[0]


class TestOldRunsRemoved:
    def test_this_state_dirs_old_runs_go_with_all_their_rows_and_every_other_run_stays(self, config_file, server, capsys):
        """Runs of this state dir that ended longer ago than keep_runs_days go whole; a recent one, another state
        dir's, an unnamed older version's (whose, with another state dir's run in the store, cannot be told) and one
        still running stay, and tonight's report is tonight's night."""
        config = config_file(state={"keep_runs_days": 7})
        old_night = a_first_night(config, server)
        mine = state_identity(config.parent / "state")
        old_failed = a_run(config, state_id=mine)
        recent, other, unnamed = a_run(config, state_id=mine), a_run(config, state_id=OTHER_STATE_DIR), a_run(config, state_id=None)
        # Still running under another host name, its lease alive: a copy of this state dir at work elsewhere.
        running = a_run(config, state_id=mine, host="elsewhere", running=True)
        store = RunStore.open(f"sqlite:///{store_file(config)}")
        try:
            pid = store.run(running).pid
            assert store.acquire_lease("elsewhere-task", f"elsewhere:{pid}:n0nce:{mine}", ttl_s=600)
        finally:
            store.close()
        for run_id in (old_night, old_failed, other, unnamed, running):
            age(config, run_id, began_days_ago=40, ended_days_ago=None if run_id == running else 39)
        age(config, recent, began_days_ago=6.5, ended_days_ago=6)
        before = {run_id: rows_of(config, run_id) for run_id in (old_night, old_failed, recent, other, unnamed, running)}
        assert before[old_night]["events"] > 5 and before[old_failed] == {"runs": 1, "task_runs": 1, "iterations": 1, "events": 3}

        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0

        empty = {"runs": 0, "task_runs": 0, "iterations": 0, "events": 0}
        assert rows_of(config, old_night) == empty and rows_of(config, old_failed) == empty
        assert all(rows_of(config, run_id) == before[run_id] for run_id in (recent, other, unnamed, running))
        with sqlite3.connect(store_file(config)) as db:
            assert db.execute("SELECT status FROM runs WHERE id = ?", (running,)).fetchone() == ("running",)
            assert db.execute("SELECT count(*) FROM leases WHERE task = 'elsewhere-task'").fetchone() == (1,)
        tonight = report_json(config, capsys)
        assert tonight["run"]["id"] > running and tonight["run"]["status"] == "finished"
        [task] = tonight["tasks"]
        assert (task["name"], task["outcome"]) == ("fix-greet", "succeeded") and task["iterations"]

    def test_in_its_own_store_a_state_dirs_runs_recorded_before_state_dirs_had_names_go_too(self, config_file, server):
        """In the state dir's own SQLite file, with no other state dir's run in it, a run an older version recorded
        without a state dir's name is this state dir's: an old one goes whole, a recent one stays."""
        config = config_file(state={"keep_runs_days": 7})
        (config.parent / "state").mkdir()
        old_unnamed, recent_unnamed = a_run(config, state_id=None), a_run(config, state_id=None)
        age(config, old_unnamed, began_days_ago=40, ended_days_ago=39)
        age(config, recent_unnamed, began_days_ago=6.5, ended_days_ago=6)
        recent = rows_of(config, recent_unnamed)

        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0

        assert rows_of(config, old_unnamed) == {"runs": 0, "task_runs": 0, "iterations": 0, "events": 0}
        assert rows_of(config, recent_unnamed) == recent

    def test_runs_removed_is_logged_before_the_night(self, tmp_path, repo, server):
        """`runs_removed` (`count`, `older_than_days`) comes before the night's run exists: it carries no run_id."""
        config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, state={"keep_runs_days": 3})
        old = a_first_night(config, server)
        age(config, old, began_days_ago=5, ended_days_ago=4)
        server.enqueue(*FIX)
        night = _json_run(config)
        assert night.exit_code == 0, night.events
        removed = _one(night.events, "runs_removed")
        assert (removed["count"], removed["older_than_days"]) == (1, 3) and "run_id" not in removed
        names = [event["event"] for event in night.events]
        assert names.index("runs_removed") < names.index("night_started")

    def test_the_runs_of_a_scheduled_nights_fire_stay_however_old(self, config_file, server, capsys):
        """A night `serve` begins again for a fire days ago keeps the runs begun since that fire, which tell it what the
        fire's earlier runs did (the task they finished is not worked again); older ones go."""
        config = config_file(state={"keep_runs_days": 2})
        (config.parent / "state").mkdir()
        older = a_run(config, state_id=state_identity(config.parent / "state"))
        fires_run = a_first_night(config, server)
        age(config, older, began_days_ago=6, ended_days_ago=5.5)
        age(config, fires_run, began_days_ago=4, ended_days_ago=3.9)
        fire = (datetime.now(timezone.utc) - timedelta(days=5)).isoformat()

        assert overnight("run", "--config", str(config), "--scheduled-for", fire) == 0

        assert rows_of(config, older)["runs"] == 0 and rows_of(config, fires_run)["runs"] == 1
        [task] = report_json(config, capsys)["tasks"]
        assert (task["outcome"], task["reason"]) == ("skipped", "done_earlier_tonight")

    def test_a_store_that_refuses_the_delete_is_logged_and_the_night_goes_on(self, tmp_path, repo, server):
        """`runs_not_removed` (`error`, the key shown as ***) when the store fails the delete; the batch is rolled back
        whole (the run keeps every row), and the night runs."""
        config = write_config(
            tmp_path / "overnight.toml", api_base=server.url, repo=repo, state={"keep_runs_days": 1}, model={"api_key": API_KEY}
        )
        old = a_first_night(config, server)
        age(config, old, began_days_ago=3, ended_days_ago=2)
        before = rows_of(config, old)
        with sqlite3.connect(store_file(config)) as db:
            # Refused after its events, iterations and task runs were deleted in the same transaction.
            db.execute(f"CREATE TRIGGER keep_runs BEFORE DELETE ON runs BEGIN SELECT RAISE(ABORT, 'runs are kept here {API_KEY}'); END")
        server.enqueue(*FIX)
        night = _json_run(config)
        assert night.exit_code == 0, night.events
        failed = _one(night.events, "runs_not_removed")
        assert "runs are kept here ***" in failed["error"] and API_KEY not in failed["error"] and "run_id" not in failed
        assert "runs_removed" not in [event["event"] for event in night.events]
        assert rows_of(config, old) == before


def latest_run_of(store: Path, state_dir: Path) -> int:
    """The id of the newest run of `state_dir` in the shared SQLite file `store`."""
    with sqlite3.connect(store) as db:
        return db.execute("SELECT max(id) FROM runs WHERE state_id = ?", (state_identity(state_dir),)).fetchone()[0]


def runs_begun_days_ago(store: Path, state_dir: Path) -> list[float]:
    """How many days ago each run of `state_dir` in the shared SQLite file `store` began (to a tenth), oldest first."""
    with sqlite3.connect(store) as db:
        query = "SELECT round(julianday('now') - julianday(started_at), 1) FROM runs WHERE state_id = ? ORDER BY started_at"
        return [days for (days,) in db.execute(query, (state_identity(state_dir),))]


def an_ended_run(store: Path, state_dir: Path, the_work: str, outcome: str) -> int:
    """A run of `state_dir` in the shared SQLite file `store` whose one task, fix-greet (the work `the_work`), ended `outcome`."""
    shared = RunStore.open(f"sqlite:///{store}")
    try:
        run = shared.begin_run(config_path="b.toml", pid=dead_pid(), host=socket.gethostname(), state_id=state_identity(state_dir))
        task_run = shared.begin_task(run, name="fix-greet", branch="overnight/fix-greet", work_key=the_work)
        shared.finish_task(task_run, outcome=outcome, reason="" if outcome == "succeeded" else "check_failed", commit="c" * 40)
        shared.finish_run(run, status="finished", exit_code=0 if outcome == "succeeded" else 1)
        return run
    finally:
        shared.close()


def assert_the_newest_finish_of_each_work_stays(store: RunStore) -> None:
    """Runs of state dir `s` ended just now, removed as a store machines share removes them: only those holding a
    work's newest finish with success in the whole store (a task `succeeded`, or only an iteration `committed`) stay;
    removed as from the state dir's own store, they go too. A run with no state dir's name stays either way (another
    state dir's run is in the store)."""

    def a_run(work: str, outcome: str, *, committed: bool = False, state_id: str | None = "s") -> int:
        run = store.begin_run(config_path="c.toml", pid=1, host="h", state_id=state_id)
        task = store.begin_task(run, name="t", branch="overnight/t", work_key=work)
        iteration = store.begin_iteration(task, number=1, checkpoint="c", pid=1)
        store.finish_iteration(iteration, outcome="committed" if committed else "rolled_back", commit="c" * 40 if committed else "")
        store.finish_task(task, outcome=outcome, reason="" if outcome == "succeeded" else "interrupted")
        store.finish_run(run, status="finished", exit_code=0)
        return run

    older, failed = a_run("w1", "succeeded", committed=True), a_run("w1", "failed")
    only_committed, newest = a_run("w2", "failed", committed=True), a_run("w1", "succeeded")
    finished_again_elsewhere = a_run("w3", "succeeded")
    a_run("w3", "succeeded", state_id="another")
    unnamed = a_run("w4", "failed", state_id=None)
    store.flush()
    assert sum(store.remove_old_runs("s", timedelta(0), shared=True)) == 3
    kept = [store.run(run) is not None for run in (older, failed, only_committed, newest, finished_again_elsewhere, unnamed)]
    assert kept == [False, False, True, True, False, True]
    assert sum(store.remove_old_runs("s", timedelta(0), shared=False)) == 2 and store.run(unnamed) is not None


class TestSharedStore:
    def test_only_the_newest_finish_of_each_work_is_spared(self, tmp_path):
        """In a shared store, an old run stays only while it holds the store's newest finish with success of a work."""
        store = RunStore.open(f"sqlite:///{tmp_path / 'shared.db'}")
        try:
            assert_the_newest_finish_of_each_work_stays(store)
        finally:
            store.close()

    def test_a_night_dead_for_weeks_still_finds_its_waiting_task_done_elsewhere(self, tmp_path, repo, server, capsys):
        """In a store machines share, keep_runs_days spares the newest run that finished a work with success (older ones
        of that work, and failed ones, go): the recovery of a night killed weeks ago while its task waited for that
        work's lease still records the task `done_elsewhere`, not `leased`."""
        shared = tmp_path / "shared.db"
        config_a = shared_config(tmp_path / "a", repo, server, shared)
        held_by_another_machine(shared, repo, ttl_s=600)
        killed_while_it_waits(config_a)
        dead = latest_run_of(shared, tmp_path / "a" / "state")
        store = RunStore.open(f"sqlite:///{shared}")
        try:  # machine B's holder gone: B's next night takes the lease and finishes the work
            store.release_lease(lease_key("fix-greet", repository_key(Repo(repo), "HEAD")), HOLDER)
        finally:
            store.close()
        machine_b = clone(repo, tmp_path / "b-repo")
        config_b = shared_config(tmp_path / "b", machine_b, server, shared, state={"keep_runs_days": 7})
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config_b)) == 0
        state_b = tmp_path / "b" / "state"
        finished_it = latest_run_of(shared, state_b)
        the_work = work_key(repository_key(Repo(repo), "HEAD"), load_config(config_a).task[0])
        older_success, failed = an_ended_run(shared, state_b, the_work, "succeeded"), an_ended_run(shared, state_b, the_work, "failed")
        age(config_a, dead, began_days_ago=41, ended_days_ago=None, store=shared)
        age(config_b, finished_it, began_days_ago=40.5, ended_days_ago=40, store=shared)
        age(config_b, older_success, began_days_ago=50, ended_days_ago=49.9, store=shared)
        age(config_b, failed, began_days_ago=45, ended_days_ago=44.9, store=shared)

        # Machine B's next night, weeks later, works other tasks; its keep_runs_days removes its old runs first.
        other_task = {"name": "other-task", "prompt": "greet() should say hello.", "check": "python check_greet.py"}
        config_b = shared_config(tmp_path / "b", machine_b, server, shared, state={"keep_runs_days": 7}, tasks=[other_task])
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config_b)) == 0

        # By age, not id: SQLite gives tonight's run the id of the newest one removed.
        assert runs_begun_days_ago(shared, state_b) == [40.5, 0.0]
        recover(load_config(config_a))
        [task] = report_json(config_a, capsys)["tasks"]
        assert (task["outcome"], task["reason"]) == ("skipped", "done_elsewhere")


class TestConfig:
    @pytest.mark.parametrize("days", [1, 7.5, 36500])
    def test_a_day_or_more_is_taken(self, tmp_path, repo, days):
        """1 day to 100 years are accepted as they are."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, state={"keep_runs_days": days})
        assert load_config(config).state.keep_runs_days == days

    @pytest.mark.parametrize(
        ("value", "fragments"),
        [
            (0.5, ("[state] keep_runs_days", "0.5 is under a day", "tonight's own account", "or 0")),
            (-1, ("[state] keep_runs_days", "greater than or equal to 0")),
            (36501, ("[state] keep_runs_days", "less than or equal to 36500")),
            ("a week", ("[state] keep_runs_days", "valid number")),
            (True, ("[state] keep_runs_days", "must be a number, not true")),
        ],
    )
    def test_a_bad_value_exits_2_with_one_line(self, tmp_path, repo, value, fragments):
        """Below a day (but not 0), negative, past 100 years or not a number: exit 2, one line naming the key."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, state={"keep_runs_days": value})
        assert_one_line_error(overnight_process("run", "--config", str(config)), 2, *fragments)
        assert not (tmp_path / "state" / "runs.db").exists()

    def test_fewer_days_than_twice_the_misfire_grace_exit_2(self, tmp_path, repo):
        """A scheduled night begun late reads its fire's runs: keep_runs_days under twice `[schedule] misfire_grace_s` is refused."""
        config = write_config(
            tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, state={"keep_runs_days": 3},
            extra="[schedule]\nmisfire_grace_s = 172800\n",
        )
        result = overnight_process("run", "--config", str(config))
        assert_one_line_error(result, 2, "[state] keep_runs_days", "twice [schedule] misfire_grace_s (172800 s)", "at least 4")
