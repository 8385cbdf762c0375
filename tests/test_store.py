"""The run store, on real SQLite files."""

from __future__ import annotations

import json
import sqlite3
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from orchestrator.errors import StateError
from orchestrator.records import IterationOutcome, Level, Signal, TaskOutcome
from orchestrator.report import as_json
from runs import RunStore, worst_signal
from runs.old_runs import RUNS_PER_BATCH


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "runs.db"


@pytest.fixture
def store(db_path: Path):
    opened = RunStore.open(f"sqlite:///{db_path}")
    yield opened
    opened.close()


def _iteration(store: RunStore, task: str = "fix-bug", number: int = 1) -> tuple[int, int, int]:
    """A run with one task and one running iteration; returns their ids."""
    run_id = store.begin_run(config_path="/repo/overnight.toml", pid=100, host="box")
    task_id = store.begin_task(run_id, name=task, branch=f"overnight/{task}")
    iteration_id = store.begin_iteration(task_id, number=number, checkpoint="abc123", pid=101)
    return run_id, task_id, iteration_id


class TestOpening:
    def test_creates_missing_parent_directory(self, db_path: Path) -> None:
        """Opening a store under a directory that does not exist yet creates it and the file."""
        RunStore.open(f"sqlite:///{db_path}").close()
        assert db_path.is_file()

    def test_sqlite_file_is_in_wal_mode(self, store: RunStore, db_path: Path) -> None:
        """The database file is switched to write-ahead logging, so readers never block the night."""
        with sqlite3.connect(db_path) as raw:
            assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    def test_foreign_keys_are_enforced(self, store: RunStore) -> None:
        """An event for an iteration that does not exist is refused, as a one-line StateError at the next flush."""
        store.record_tool_call(999, name="read_file", ok=True)  # queued: events are written in the background
        with pytest.raises(StateError, match="FOREIGN KEY") as caught:
            store.flush()
        assert "\n" not in str(caught.value)
        assert store.latest_run() is None  # said once; the store goes on working

    def test_parent_is_a_regular_file(self, tmp_path: Path) -> None:
        """A store path below a regular file raises StateError with a one-line message naming the path."""
        blocker = tmp_path / "state"
        blocker.write_text("not a directory")
        with pytest.raises(StateError) as caught:
            RunStore.open(f"sqlite:///{blocker / 'runs.db'}")
        message = str(caught.value)
        assert "\n" not in message
        assert "is not a directory" in message

    @pytest.mark.parametrize("query", ["timeout=abc", "check_same_thread=maybe"])
    def test_a_query_argument_the_driver_cannot_take_is_one_line(self, tmp_path: Path, query: str) -> None:
        """A URL query the sqlite driver refuses (the config check is the first guard; this the last) is a StateError, not a ValueError."""
        with pytest.raises(StateError) as caught:
            RunStore.open(f"sqlite:///{tmp_path / 'runs.db'}?{query}").close()
        assert "\n" not in str(caught.value) and "cannot open run store" in str(caught.value)

    def test_file_that_is_not_a_database(self, tmp_path: Path) -> None:
        """A garbage file where the database should be raises StateError with a one-line message."""
        garbage = tmp_path / "runs.db"
        garbage.write_bytes(b"\x00\xffthis is not sqlite at all" * 200)
        with pytest.raises(StateError, match="not a database") as caught:
            RunStore.open(f"sqlite:///{garbage}")
        assert "\n" not in str(caught.value)

    def test_reopening_keeps_what_was_written(self, db_path: Path) -> None:
        """A store closed and opened again on the same file still has its runs."""
        first = RunStore.open(f"sqlite:///{db_path}")
        run_id = first.begin_run(config_path="c.toml", pid=1, host="h")
        first.close()
        second = RunStore.open(f"sqlite:///{db_path}")
        try:
            assert second.latest_run().id == run_id
        finally:
            second.close()


class TestRoundTrip:
    def test_whole_run_reads_back_as_written(self, store: RunStore) -> None:
        """A run with two tasks, their iterations and events reads back with every field intact."""
        run_id = store.begin_run(config_path="/repo/overnight.toml", pid=100, host="box")
        first = store.begin_task(run_id, name="fix-bug", branch="overnight/fix-bug")
        failed = store.begin_iteration(first, number=1, checkpoint="c0", pid=100, transcript="t/1.jsonl")
        store.record_model_call(failed, prompt_tokens=900, completion_tokens=40, latency_ms=1200, finish_reason="tool_calls")
        store.record_tool_call(failed, name="edit_file", ok=False, message="no match", data={"path": "a.py"})
        store.record_signal(failed, level=Level.WARNING, kind="repeat", message="same call twice")
        store.record_signal(failed, level="severe", kind="loop", message="same call five times")
        store.finish_iteration(
            failed,
            outcome=IterationOutcome.ROLLED_BACK,
            reason="loop",
            correction="read the file before editing",
            turns=7,
            tokens=940,
        )
        passed = store.begin_iteration(first, number=2, checkpoint="c0", pid=100)
        store.record_model_call(passed, prompt_tokens=500, completion_tokens=20, latency_ms=800)
        store.finish_iteration(passed, outcome="committed", commit="c1", turns=3, tokens=520)
        store.finish_task(first, outcome=TaskOutcome.SUCCEEDED, commit="c1")
        second = store.begin_task(run_id, name="add-docs", branch="overnight/add-docs")
        store.finish_task(second, outcome="paused", reason="model_unreachable")
        store.finish_run(run_id, status="finished", exit_code=0)

        run = store.run(run_id)

        assert (run.status, run.exit_code, run.pid, run.host) == ("finished", 0, 100, "box")
        assert [(t.name, t.outcome, t.reason, t.commit) for t in run.tasks] == [
            ("fix-bug", "succeeded", "", "c1"),
            ("add-docs", "paused", "model_unreachable", ""),
        ]
        one, two = run.tasks[0].iterations
        assert (one.number, one.outcome, one.reason, one.correction) == (
            1,
            "rolled_back",
            "loop",
            "read the file before editing",
        )
        assert (one.turns, one.tokens, one.transcript, one.task_name) == (7, 940, "t/1.jsonl", "fix-bug")
        assert one.signals == (
            Signal(Level.WARNING, "repeat", "same call twice"),
            Signal(Level.SEVERE, "loop", "same call five times"),
        )
        assert (one.model_calls, one.tool_calls) == (1, 1)
        assert (two.number, two.outcome, two.commit, two.model_calls, two.signals) == (2, "committed", "c1", 1, ())
        assert run.tasks[1].iterations == ()

    def test_datetimes_are_aware_utc(self, store: RunStore) -> None:
        """Every timestamp comes back timezone-aware in UTC, and finishing sets finished_at."""
        run_id, task_id, iteration_id = _iteration(store)
        store.finish_iteration(iteration_id, outcome="committed")
        store.finish_task(task_id, outcome="succeeded")
        store.finish_run(run_id, status="finished", exit_code=0)
        run = store.run(run_id)
        iteration = run.tasks[0].iterations[0]
        stamps = [run.started_at, run.finished_at, iteration.started_at, iteration.finished_at, iteration.heartbeat_at]
        assert all(stamp.tzinfo == timezone.utc for stamp in stamps)
        assert run.started_at <= iteration.started_at <= iteration.finished_at <= run.finished_at

    def test_a_stored_runs_json_report_is_json_ready(self, store: RunStore) -> None:
        """A stored run's `report --json` document goes through json.dumps, with ISO timestamps in UTC and signals as plain dicts."""
        run_id, _, iteration_id = _iteration(store)
        store.record_signal(iteration_id, level="warning", kind="slow", message="30 s for one answer")
        loaded = json.loads(json.dumps(as_json(store.run(run_id))))
        iteration = loaded["tasks"][0]["iterations"][0]
        assert iteration["signals"] == [{"level": "warning", "kind": "slow", "message": "30 s for one answer"}]
        assert loaded["run"]["finished_at"] is None
        assert loaded["run"]["started_at"].endswith("+00:00")

    def test_missing_run_reads_as_none(self, store: RunStore) -> None:
        """Asking for a run id that does not exist, or the latest run of an empty store, gives None."""
        assert store.run(42) is None
        assert store.latest_run() is None

    def test_finishing_unknown_row_is_an_error(self, store: RunStore) -> None:
        """Finishing an iteration that was never begun raises LookupError instead of passing silently."""
        with pytest.raises(LookupError, match="iterations"):
            store.finish_iteration(7, outcome="committed")


class TestEventsInTheBackground:
    def test_second_store_sees_events_once_flushed(self, store: RunStore, db_path: Path) -> None:
        """Events are committed by the writer thread; after a flush another store on the same file sees them."""
        run_id, _, iteration_id = _iteration(store)
        reader = RunStore.open(f"sqlite:///{db_path}")
        try:
            store.record_tool_call(iteration_id, name="read_file", ok=True)
            store.flush()
            assert reader.run(run_id).tasks[0].iterations[0].tool_calls == 1
            store.record_signal(iteration_id, level="severe", kind="loop", message="stuck")
            store.flush()
            assert reader.run(run_id).tasks[0].iterations[0].signals[-1].kind == "loop"
        finally:
            reader.close()

    def test_an_iteration_never_ends_before_its_events_are_in(self, store: RunStore, db_path: Path) -> None:
        """finish_iteration waits for the queued events: whoever sees the end sees every event before it."""
        _, _, iteration_id = _iteration(store)
        for i in range(300):
            store.record_tool_call(iteration_id, name="read_file", ok=True, data={"i": i})
        store.finish_iteration(iteration_id, outcome="committed", commit="abc", turns=300)
        with sqlite3.connect(db_path) as raw:
            events = raw.execute("SELECT count(*) FROM events WHERE iteration_id = ?", (iteration_id,)).fetchone()[0]
            outcome = raw.execute("SELECT outcome FROM iterations WHERE id = ?", (iteration_id,)).fetchone()[0]
        assert (outcome, events) == ("committed", 300)

    def test_half_a_surrogate_pair_never_fails_the_batch(self, store: RunStore, db_path: Path) -> None:
        """A stray lone surrogate in an event would fail its whole batch, and so the night's store; it is stored as its escape."""
        run_id, _, iteration_id = _iteration(store)
        lone = json.loads('"\\ud83d"')
        store.record_tool_call(iteration_id, name="read_file", ok=False, message="no file " + lone)
        store.record_signal(iteration_id, level="warning", kind="odd", message="saw " + lone)
        store.finish_iteration(iteration_id, outcome="committed", commit="abc", turns=1)
        assert store.run(run_id).tasks[0].iterations[0].signals[-1].message == "saw \\ud83d"

    def test_a_failing_batch_is_reported_once_and_the_writer_lives_on(self, tmp_path: Path) -> None:
        """Whatever a batch raises reaches the next flush as StateError; later rows are still written."""
        from runs.event_writer import EventWriter

        written: list[int] = []

        def write(rows, beats) -> None:
            if any(row["n"] < 0 for row in rows):
                raise TypeError("cannot store this row")
            written.extend(row["n"] for row in rows)

        writer = EventWriter(write, str)
        writer.put({"n": -1, "iteration_id": 1, "at": None})
        with pytest.raises(StateError, match="cannot store this row"):
            writer.flush()
        writer.put({"n": 7, "iteration_id": 1, "at": None})
        writer.flush()
        writer.close()
        assert written == [7]

    def test_a_batch_beats_each_iteration_at_its_latest_model_call(self) -> None:
        """Several model calls of one iteration in one batch (queued within the writer's linger): its heartbeat
        is the last one's time, not the first's."""
        from runs.event_writer import EventWriter

        beaten: dict[int, int] = {}
        writer = EventWriter(lambda rows, beats: beaten.update(beats), str)
        for at in (1, 2, 3):
            writer.put({"iteration_id": 1, "at": at}, beat=True)
        writer.put({"iteration_id": 1, "at": 4})  # a tool call: no beat
        writer.put({"iteration_id": 2, "at": 5}, beat=True)
        writer.flush()
        writer.close()
        assert beaten == {1: 3, 2: 5}

    def test_a_model_call_beats_the_heartbeat(self, store: RunStore) -> None:
        run_id, _, iteration_id = _iteration(store)
        before = store.run(run_id).tasks[0].iterations[0].heartbeat_at
        store.record_model_call(iteration_id, prompt_tokens=10, completion_tokens=2, latency_ms=5)
        assert store.run(run_id).tasks[0].iterations[0].heartbeat_at > before

    def test_concurrent_writers_all_land(self, store: RunStore) -> None:
        """Four threads recording fifty events each through one store lose none of them."""
        run_id = store.begin_run(config_path="c.toml", pid=1, host="h")
        task_id = store.begin_task(run_id, name="t", branch="b")
        iteration_ids = [store.begin_iteration(task_id, number=n, checkpoint="c", pid=1) for n in range(1, 5)]
        errors: list[BaseException] = []

        def write(iteration_id: int) -> None:
            try:
                for i in range(50):
                    store.record_tool_call(iteration_id, name="read_file", ok=True, data={"i": i})
            except BaseException as exc:  # reported below; a thread's exception would vanish otherwise
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(iteration_id,)) for iteration_id in iteration_ids]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        assert errors == []
        assert [it.tool_calls for it in store.run(run_id).tasks[0].iterations] == [50, 50, 50, 50]


class TestEventBatches:
    """SQLite's batches skip SQLAlchemy's per-statement work (runs/event_batches.py): what they store must
    be what SQLAlchemy stores, and a failed batch must leave nothing behind."""

    def test_rows_and_heartbeats_are_stored_as_sqlalchemy_stores_them(self, store: RunStore, db_path: Path) -> None:
        from sqlalchemy import insert, update

        from runs.event_batches import EventBatches
        from runs.models import Event, Iteration

        _, task_id, first = _iteration(store)
        second = store.begin_iteration(task_id, number=2, checkpoint="abc123", pid=101)
        at = datetime(2026, 12, 2, 3, 4, 5, 678901, tzinfo=timezone(timedelta(hours=-5)))
        rows = [
            {"at": at, "type": "tool_call", "name": "write_file", "level": "", "message": "wrote ü\x00 \U0001f600 'quoted'",
             "prompt_tokens": 0, "completion_tokens": 0, "latency_ms": 7, "ok": True, "data": {"path": "a b.txt", "n": [1, 2.5, None]}},
            {"at": at, "type": "model_call", "name": "stop", "level": "", "message": "", "prompt_tokens": 120,
             "completion_tokens": 30, "latency_ms": 51, "ok": None, "data": {}},
            {"at": at, "type": "signal", "name": "repeated_tool_call", "level": "warning", "message": "again",
             "prompt_tokens": 0, "completion_tokens": 0, "latency_ms": 0, "ok": False, "data": {"count": 3}},
        ]
        store.flush()
        engine = store._engine
        with engine.begin() as connection:  # SQLAlchemy's own way, for the first iteration
            connection.execute(insert(Event.__table__), [{**row, "iteration_id": first} for row in rows])
            connection.execute(update(Iteration.__table__).where(Iteration.__table__.c.id == first).values(heartbeat_at=at))
        batches = EventBatches(engine)
        try:
            batches.write([{**row, "iteration_id": second} for row in rows], {second: at})
        finally:
            batches.close()

        with sqlite3.connect(db_path) as raw:
            def stored(iteration_id: int) -> list[tuple]:
                return raw.execute("SELECT * FROM events WHERE iteration_id = ? ORDER BY id", (iteration_id,)).fetchall()

            def beat(iteration_id: int) -> tuple:
                return raw.execute("SELECT heartbeat_at, typeof(heartbeat_at) FROM iterations WHERE id = ?", (iteration_id,)).fetchone()

            ours, theirs = stored(second), stored(first)
            typed = "SELECT " + ", ".join(f"typeof({c})" for c in ("at", "name", "ok", "data", "latency_ms")) + " FROM events WHERE iteration_id = ? ORDER BY id"
            assert raw.execute(typed, (second,)).fetchall() == raw.execute(typed, (first,)).fetchall()
        assert len(ours) == 3
        assert [row[2:] for row in ours] == [row[2:] for row in theirs]  # all but the id and the iteration
        assert beat(second) == beat(first)
        view = store.run(store.begun_run_id).tasks[0].iterations[1]  # and read back as the store reads its own
        assert (view.model_calls, view.tool_calls) == (1, 1)
        assert view.signals == (Signal(Level.WARNING, "repeated_tool_call", "again"),)
        assert view.heartbeat_at == at

    def test_a_failed_batch_leaves_nothing_and_the_next_is_written(self, store: RunStore, db_path: Path) -> None:
        from runs.event_batches import EventBatches
        from runs.event_rows import event_row

        _, _, iteration_id = _iteration(store)
        store.flush()
        batches = EventBatches(store._engine)
        try:
            good, orphan = event_row(iteration_id, "tool_call", name="read_file"), event_row(iteration_id + 999, "tool_call", name="x")
            with pytest.raises(sqlite3.IntegrityError):  # foreign_keys=ON: no such iteration
                batches.write([good, orphan], {iteration_id: good["at"]})
            batches.write([event_row(iteration_id, "tool_call", name="list_dir")], {})
        finally:
            batches.close()
        with sqlite3.connect(db_path) as raw:
            assert raw.execute("SELECT name FROM events").fetchall() == [("list_dir",)]


class TestQueries:
    def test_a_runs_tasks_are_listed_in_the_configs_order(self, store: RunStore) -> None:
        """With concurrency the threads begin tasks in another order each night: reports and JUnit cases
        followed it (t1, t3, t2 one night, t2, t1, t3 the next). Rows of an older version (no position) come last."""
        run = store.begin_run(config_path="c.toml", pid=1, host="h")
        for name, position in (("t3", 2), ("t1", 0), ("old", None), ("t2", 1)):
            store.begin_task(run, name=name, branch=f"overnight/{name}", position=position)
        assert [task.name for task in store.run(run).tasks] == ["t1", "t2", "t3", "old"]

    def test_running_iterations_finds_unfinished_ones(self, store: RunStore) -> None:
        """Only iterations never finished are returned, each with its task name, pid and checkpoint."""
        _, _, finished = _iteration(store, task="done")
        store.finish_iteration(finished, outcome="committed")
        _, _, orphan = _iteration(store, task="crashed")

        running = store.running_iterations()

        assert [(it.id, it.task_name, it.pid, it.checkpoint, it.outcome) for it in running] == [
            (orphan, "crashed", 101, "abc123", "running")
        ]

    def test_latest_run_is_the_newest(self, store: RunStore) -> None:
        """latest_run returns the run begun last, with its own tasks."""
        old, _, _ = _iteration(store, task="old-task")
        store.finish_run(old, status="crashed", exit_code=1)
        new, _, _ = _iteration(store, task="new-task")

        latest = store.latest_run()

        assert latest.id == new
        assert latest.status == "running"
        assert [task.name for task in latest.tasks] == ["new-task"]

    def test_iterations_for_task_newest_first_across_runs(self, store: RunStore) -> None:
        """A task's iterations from every run come newest first, other tasks left out, up to the limit."""
        _, _, first = _iteration(store, task="fix-bug", number=1)
        _iteration(store, task="other")
        _, task_id, second = _iteration(store, task="fix-bug", number=1)
        third = store.begin_iteration(task_id, number=2, checkpoint="c", pid=5)

        assert [it.id for it in store.iterations_for_task("fix-bug")] == [third, second, first]
        assert [it.id for it in store.iterations_for_task("fix-bug", limit=2)] == [third, second]

    def test_heartbeat_moves_forward(self, store: RunStore) -> None:
        """A heartbeat updates the iteration's last sign of life."""
        _, _, iteration_id = _iteration(store)
        before = store.running_iterations()[0].heartbeat_at
        store.heartbeat(iteration_id)
        assert store.running_iterations()[0].heartbeat_at > before

    def test_model_call_is_a_heartbeat_too(self, store: RunStore) -> None:
        """Recording a model call also moves the heartbeat, in the same commit."""
        _, _, iteration_id = _iteration(store)
        before = store.running_iterations()[0].heartbeat_at
        store.record_model_call(iteration_id, prompt_tokens=1, completion_tokens=1, latency_ms=1)
        assert store.running_iterations()[0].heartbeat_at > before


class TestRecoveryWrites:
    """What crash recovery writes for a dead night (orchestrator/dead_runs.py and owed_notes.py, crash recovery's steps, call these)."""

    def test_interrupting_an_iteration_that_has_ended_changes_nothing(self, store: RunStore) -> None:
        """An iteration that ended between recovery's look and its write (another host's, still alive) keeps its end."""
        run_id, _, iteration_id = _iteration(store)
        store.finish_iteration(iteration_id, outcome="committed", commit="c1", turns=3, tokens=50)
        assert store.interrupt_iteration(iteration_id, correction="killed") is False
        [view] = store.run(run_id).tasks[0].iterations
        assert (view.outcome, view.reason, view.commit, view.turns, view.tokens) == ("committed", "", "c1", 3, 50)

    def test_an_interrupted_iteration_counts_its_model_calls_and_ends_when_last_seen(self, store: RunStore) -> None:
        run_id, _, iteration_id = _iteration(store)
        store.record_model_call(iteration_id, prompt_tokens=100, completion_tokens=20, latency_ms=5)
        store.record_model_call(iteration_id, prompt_tokens=200, completion_tokens=30, latency_ms=5)
        beat = store.run(run_id).tasks[0].iterations[0].heartbeat_at
        assert store.interrupt_iteration(iteration_id, correction="killed") is True
        [view] = store.run(run_id).tasks[0].iterations
        assert (view.outcome, view.reason, view.correction, view.turns, view.tokens) == ("interrupted", "interrupted", "killed", 2, 350)
        assert view.finished_at == beat

    def test_a_dead_task_whose_check_passed_with_nothing_to_commit_succeeded(self, store: RunStore) -> None:
        """A committed iteration's commit is "" when the check passed with nothing to commit: still a success."""
        run_id, task_id, iteration_id = _iteration(store)
        store.finish_iteration(iteration_id, outcome="committed", commit="")
        other = store.begin_task(run_id, name="other", branch="overnight/other")
        store.finish_iteration(store.begin_iteration(other, number=1, checkpoint="c", pid=1), outcome="rolled_back", reason="check_failed")
        store.close_interrupted_run(run_id)
        run = store.run(run_id)
        assert [(t.name, t.outcome, t.reason, t.commit) for t in run.tasks] == [
            ("fix-bug", "succeeded", "", ""),
            ("other", "failed", "interrupted", ""),
        ]
        assert run.status == "crashed" and run.exit_code is None

    def test_closing_a_run_that_has_ended_meanwhile_changes_nothing(self, store: RunStore, db_path: Path) -> None:
        """A run seen running by recovery that its own night finished before recovery's write (another host's, slow but
        alive, on the shared store) keeps its status, end and exit code: it is not turned into a crash."""
        run_id, task_id, iteration_id = _iteration(store)
        [seen] = store.running_runs()
        night = RunStore.open(f"sqlite:///{db_path}")  # the night's own connection, another writer
        try:
            night.finish_iteration(iteration_id, outcome="committed", commit="c1")
            night.finish_task(task_id, outcome="succeeded", commit="c1")
            night.finish_run(run_id, status="finished", exit_code=0)
        finally:
            night.close()
        finished = store.run(run_id)
        assert store.close_interrupted_run(seen.id, never_begun_reason="night_crashed") == []
        run = store.run(run_id)
        assert (run.status, run.exit_code, run.finished_at) == ("finished", 0, finished.finished_at)
        assert [(task.outcome, task.commit) for task in run.tasks] == [("succeeded", "c1")]

    def test_a_dead_run_ends_when_it_was_last_seen_alive(self, store: RunStore) -> None:
        """Found dead (no exit code), a run and its open tasks end at its latest heartbeat, not its first nor the moment found."""
        run_id, _, first = _iteration(store)
        second = store.begin_iteration(store.begin_task(run_id, name="two", branch="overnight/two"), number=1, checkpoint="c", pid=1)
        store.heartbeat(first)
        store.heartbeat(second)
        latest = store.running_iterations()[-1].heartbeat_at
        store.close_interrupted_run(run_id)
        run = store.run(run_id)
        assert run.finished_at == latest and all(task.finished_at == latest for task in run.tasks)

    def test_a_dead_run_whose_tasks_waited_for_leases_ends_at_its_own_heartbeat(self, store: RunStore, db_path: Path) -> None:
        """A night whose tasks all wait for leases writes only its run's heartbeat: found dead, it ends at the latest one."""
        run_id = store.begin_run(config_path="/repo/overnight.toml", pid=100, host="box")
        store.wait_task_for_lease(store.begin_task(run_id, name="fix-bug", branch="overnight/fix-bug"))
        store.heartbeat_run(run_id)
        store.heartbeat_run(run_id)
        with sqlite3.connect(db_path) as db:
            [(beat,)] = db.execute("SELECT heartbeat_at FROM runs").fetchall()
        store.close_interrupted_run(run_id)
        run = store.run(run_id)
        assert run.finished_at == datetime.fromisoformat(beat).replace(tzinfo=timezone.utc) > run.tasks[0].started_at
        assert [(task.outcome, task.reason, task.finished_at) for task in run.tasks] == [("skipped", "leased", run.finished_at)]

    def test_a_store_made_before_runs_had_a_heartbeat_gets_the_column(self, db_path: Path) -> None:
        """An older store's runs table lacks `heartbeat_at`: opening adds it, and its dead runs end as before, at their last write."""
        url = f"sqlite:///{db_path}"
        older = RunStore.open(url)
        run_id = older.begin_run(config_path="c", pid=1, host="h")
        older.close()
        with sqlite3.connect(db_path) as db:
            db.execute("ALTER TABLE runs DROP COLUMN heartbeat_at")
        store = RunStore.open(url)
        try:
            began = store.run(run_id).started_at
            store.close_interrupted_run(run_id)
            assert store.run(run_id).finished_at == began
            store.heartbeat_run(store.begin_run(config_path="c", pid=2, host="h"))
        finally:
            store.close()

    def test_a_store_made_before_task_runs_had_a_detail_reads_and_gets_the_column(self, db_path: Path) -> None:
        """An older store's task_runs lack `detail`: opening adds it, its tasks read with none, and a paused task's is kept."""
        url = f"sqlite:///{db_path}"
        older = RunStore.open(url)
        run_id, old_task, _ = _iteration(older)
        older.finish_task(old_task, outcome="failed", reason="check_failed")
        older.close()
        with sqlite3.connect(db_path) as db:
            db.execute("ALTER TABLE task_runs DROP COLUMN detail")
        store = RunStore.open(url)
        try:
            paused = store.begin_task(run_id, name="two", branch="overnight/two")
            store.finish_task(paused, outcome="paused", reason="model_unreachable", detail="model endpoint http://h/v1 (m) failed 2 times")
            tasks = store.run(run_id).tasks
            assert [(task.reason, task.detail) for task in tasks] == [
                ("check_failed", ""), ("model_unreachable", "model endpoint http://h/v1 (m) failed 2 times")
            ]
        finally:
            store.close()

    def test_a_paused_tasks_detail_quoting_a_path_that_is_not_utf8_is_kept_escaped(self, store: RunStore) -> None:
        """A ModelUnreachable's text can quote a file name with a byte that is not UTF-8 (a lone surrogate): the task is
        recorded, that byte written as its escape, not refused by the database."""
        run_id, _, _ = _iteration(store)
        paused = store.begin_task(run_id, name="two", branch="overnight/two")
        store.finish_task(paused, outcome="paused", reason="model_unreachable", detail="llama-server could not be run: /opt/b\udcffin")
        assert store.run(run_id).tasks[-1].detail == "llama-server could not be run: /opt/b\\udcffin"


def _plans(store: RunStore, db_path: Path, action) -> list[str]:
    """SQLite's query plan (EXPLAIN QUERY PLAN, each step's detail) of each SELECT the store runs while `action()` runs."""
    from sqlalchemy import event

    selects: list[tuple[str, object]] = []

    def record(_connection, _cursor, statement, parameters, _context, _many) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            selects.append((statement, parameters))

    event.listen(store._engine, "before_cursor_execute", record)
    try:
        action()
    finally:
        event.remove(store._engine, "before_cursor_execute", record)
    with sqlite3.connect(db_path) as db:
        return [" / ".join(row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {statement}", parameters)) for statement, parameters in selects]


def _work_key_index(db_path: Path) -> list[str]:
    """The columns of ix_task_runs_work_key in the SQLite file, [] without it."""
    with sqlite3.connect(db_path) as db:
        return [row[2] for row in db.execute("SELECT * FROM pragma_index_info('ix_task_runs_work_key')")]


class TestWorkKeyIndex:
    """task_runs' index on (work_key, outcome, finished_at): who finished a work with success, and when."""

    def test_a_new_store_has_it_and_the_shared_stores_queries_use_it(self, store: RunStore, db_path: Path) -> None:
        """A new store is made with the index, and SQLite's plan uses it both to tell a work finished elsewhere and to
        keep the newest finish of each work when old runs are removed from a shared store."""
        run_id, task_id, iteration_id = _iteration(store)
        store.finish_iteration(iteration_id, outcome="committed", commit="c" * 40)
        store.finish_task(task_id, outcome="succeeded", commit="c" * 40)
        store.finish_run(run_id, status="finished", exit_code=0)
        assert _work_key_index(db_path) == ["work_key", "outcome", "finished_at"]
        [asked] = _plans(store, db_path, lambda: store.succeeded_elsewhere("k" * 32, run_id))
        assert "SEARCH task_runs USING INDEX ix_task_runs_work_key (work_key=?)" in asked
        removal = _plans(store, db_path, lambda: list(store.remove_old_runs("s", timedelta(0), shared=True)))
        assert any("USING INDEX ix_task_runs_work_key (work_key=? AND outcome=? AND finished_at=?)" in plan for plan in removal), removal

    def test_a_store_made_before_the_index_gets_it_when_opened(self, db_path: Path) -> None:
        """An older version's store, whose task_runs lack the index, gets it when opened again (a second open finds it
        there and changes nothing); its runs read as before."""
        url = f"sqlite:///{db_path}"
        older = RunStore.open(url)
        run_id = older.begin_run(config_path="c", pid=1, host="h")
        older.close()
        with sqlite3.connect(db_path) as db:
            db.execute("DROP INDEX ix_task_runs_work_key")
        assert _work_key_index(db_path) == []
        for _ in range(2):
            RunStore.open(url).close()
            assert _work_key_index(db_path) == ["work_key", "outcome", "finished_at"]
        store = RunStore.open(url)
        try:
            assert store.run(run_id).host == "h"
        finally:
            store.close()


class TestEarlierTonight:
    def test_an_iteration_still_marked_running_is_not_counted(self, store: RunStore) -> None:
        """A dead process's iteration not yet recovered (still `running`) is not the model's doing: it does not
        count against max_iterations, though its number and tokens are known."""
        since = datetime.now(timezone.utc) - timedelta(minutes=1)
        earlier = store.begin_run(config_path="c.toml", pid=1, host="h", state_id="s")
        task = store.begin_task(earlier, name="t", branch="overnight/t", work_key="k")
        done = store.begin_iteration(task, number=1, checkpoint="c", pid=1)
        store.finish_iteration(done, outcome="rolled_back", reason="check_failed", tokens=10)
        store.begin_iteration(task, number=2, checkpoint="c", pid=1)
        now = store.begin_run(config_path="c.toml", pid=2, host="h", state_id="s")
        seen = store.earlier_tonight("s", since, now)
        assert seen.endings == {"k": (("rolled_back", "check_failed"),)} and seen.counted("k") == 1
        assert seen.last_number == {"k": 2} and seen.tokens == {"k": 10}

    def test_the_slowest_iteration_is_not_a_wait_for_an_unreachable_model(self, store: RunStore) -> None:
        """What a night begun again judges its first iteration by: the slowest iteration the earlier runs ended, as
        the night itself times them. One the model never answered (its 40 minutes the endpoint's retries and
        timeouts) counted, and refused every task of the night begun again once the server was back; so did one a
        restart cancelled after it had waited 3 hours for the server (or been stopped, or the host asleep): that one
        ran until its last answer."""
        since = datetime.now(timezone.utc) - timedelta(minutes=1)
        earlier = store.begin_run(config_path="c.toml", pid=1, host="h", state_id="s")
        task = store.begin_task(earlier, name="t", branch="overnight/t", work_key="k")
        worked = store.begin_iteration(task, number=1, checkpoint="c", pid=1)
        store.finish_iteration(worked, outcome="rolled_back", reason="check_failed", at=store.now() + timedelta(minutes=3))
        waited = store.begin_iteration(task, number=2, checkpoint="c", pid=1)
        store.finish_iteration(waited, outcome="rolled_back", reason="model_unreachable", at=store.now() + timedelta(minutes=40))
        cut = store.begin_iteration(task, number=3, checkpoint="c", pid=1)
        store.record_model_call(cut, prompt_tokens=1, completion_tokens=1, latency_ms=1)
        store.flush()
        store.finish_iteration(cut, outcome="cancelled", reason="cancelled", at=store.now() + timedelta(hours=3))
        now = store.begin_run(config_path="c.toml", pid=2, host="h", state_id="s")
        assert 179 < store.earlier_tonight("s", since, now).slowest_iteration_s < 181

    def test_an_iteration_cut_short_ran_until_it_was_last_seen_working(self, store: RunStore, db_path: Path) -> None:
        """A killed process's iteration, recovered hours later (a host asleep, the next night's recovery), ran until
        its last heartbeat, not until recovery found it; one a restart cancelled, until its last answer; a still
        running one, another state dir's and one of a run begun before the fire time do not count."""
        since = datetime.now(timezone.utc) - timedelta(hours=4)
        before = store.begin_run(config_path="c.toml", pid=1, host="h", state_id="s")
        store.finish_iteration(
            store.begin_iteration(store.begin_task(before, name="t", branch="b", work_key="k"), number=1, checkpoint="c", pid=1),
            outcome="rolled_back", reason="check_failed", at=store.now() + timedelta(hours=2),
        )
        elsewhere = store.begin_run(config_path="c.toml", pid=1, host="h", state_id="other")
        store.finish_iteration(
            store.begin_iteration(store.begin_task(elsewhere, name="t", branch="b", work_key="k"), number=1, checkpoint="c", pid=1),
            outcome="rolled_back", reason="check_failed", at=store.now() + timedelta(hours=1),
        )
        earlier = store.begin_run(config_path="c.toml", pid=1, host="h", state_id="s")
        task = store.begin_task(earlier, name="t", branch="b", work_key="k")
        died = store.begin_iteration(task, number=1, checkpoint="c", pid=1)
        store.begin_iteration(task, number=2, checkpoint="c", pid=1)  # still `running`: not recovered yet
        cut = store.begin_iteration(task, number=3, checkpoint="c", pid=1)
        store.record_model_call(cut, prompt_tokens=1, completion_tokens=1, latency_ms=1)
        store.flush()
        began = (datetime.now(timezone.utc) - timedelta(hours=3)).replace(tzinfo=None)
        with sqlite3.connect(db_path) as raw:
            raw.execute("UPDATE runs SET started_at = ? WHERE id = ?", (str(began - timedelta(hours=2)), before))
            raw.execute("UPDATE runs SET started_at = ? WHERE id = ?", (str(began), earlier))
            raw.execute(
                "UPDATE iterations SET started_at = ?, heartbeat_at = ? WHERE id = ?", (str(began), str(began + timedelta(minutes=5)), died)
            )
            raw.execute("UPDATE iterations SET started_at = ? WHERE id = ?", (str(began), cut))
            raw.execute("UPDATE events SET at = ? WHERE iteration_id = ?", (str(began + timedelta(minutes=4)), cut))
        assert store.interrupt_iteration(died, correction="x")
        now = store.begin_run(config_path="c.toml", pid=2, host="h", state_id="s")
        assert store.earlier_tonight("s", since, now).slowest_iteration_s == 300
        # Cut short by a restart (cancelled now, 3 hours on): it ran at least until its last answer.
        store.finish_iteration(cut, outcome="cancelled", reason="cancelled")
        with sqlite3.connect(db_path) as raw:
            raw.execute("UPDATE events SET at = ? WHERE iteration_id = ?", (str(began + timedelta(minutes=6)), cut))
        assert store.earlier_tonight("s", since, now).slowest_iteration_s == 360


def _an_ended_run(store: RunStore, state_id: str = "s", *, note_owed: bool | None = None, iteration_ends: bool = True) -> int:
    """A run of state dir `state_id` with one task and one iteration (and an event), ended; its id."""
    run_id = store.begin_run(config_path="/repo/overnight.toml", pid=100, host="box", state_id=state_id)
    task_id = store.begin_task(run_id, name="fix-bug", branch="overnight/fix-bug")
    iteration_id = store.begin_iteration(task_id, number=1, checkpoint="abc123", pid=101)
    store.record_tool_call(iteration_id, name="read_file", ok=True)
    if iteration_ends:
        store.finish_iteration(iteration_id, outcome="rolled_back", reason="check_failed", note_owed=note_owed)
    store.finish_task(task_id, outcome="failed", reason="check_failed")
    store.finish_run(run_id, status="finished", exit_code=1)
    return run_id


def _ended_days_ago(db_path: Path, run_id: int, days: float) -> None:
    """The run began and ended `days` ago (its end a second after its start)."""
    began = datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(days=days, seconds=1)
    ended = began + timedelta(seconds=1)
    with sqlite3.connect(db_path) as raw:
        raw.execute("UPDATE runs SET started_at = ?, finished_at = ? WHERE id = ?", (str(began), str(ended), run_id))


def _kept(store: RunStore, *run_ids: int) -> list[int]:
    return [run_id for run_id in run_ids if store.run(run_id) is not None]


class TestRemoveOldRuns:
    """`RunStore.remove_old_runs` ([state] keep_runs_days), on what a night leaves besides plain ended runs."""

    def test_many_old_runs_go_in_batches(self, store: RunStore, db_path: Path) -> None:
        """Old runs beyond one batch all go, a batch at a time, each counted once committed; another state dir's stays."""
        old = [_an_ended_run(store) for _ in range(RUNS_PER_BATCH + 5)]
        another = _an_ended_run(store, "another")
        for run_id in (*old, another):
            _ended_days_ago(db_path, run_id, 10)
        assert list(store.remove_old_runs("s", timedelta(days=7))) == [RUNS_PER_BATCH, 5]
        assert _kept(store, *old, another) == [another]
        with sqlite3.connect(db_path) as raw:
            assert [raw.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in ("task_runs", "iterations", "events")] == [1, 1, 1]

    def test_a_run_whose_iteration_is_still_running_stays(self, store: RunStore, db_path: Path) -> None:
        """An ended run one of whose iterations is still `running` (recovery has yet to settle it) is not removed."""
        unsettled, plain = _an_ended_run(store, iteration_ends=False), _an_ended_run(store)
        for run_id in (unsettled, plain):
            _ended_days_ago(db_path, run_id, 10)
        assert sum(store.remove_old_runs("s", timedelta(days=7))) == 1
        assert _kept(store, unsettled, plain) == [unsettled]

    def test_runs_from_a_minute_before_a_run_that_owes_a_note_stay(self, store: RunStore, db_path: Path) -> None:
        """A run whose notes.md entry is still owed, and the runs that ended within a minute before it began (recovery
        counts their entries to tell whether the owed one is written), stay; older ones go."""
        older, alike, owing = _an_ended_run(store), _an_ended_run(store), _an_ended_run(store, note_owed=True)
        _ended_days_ago(db_path, older, 10)
        _ended_days_ago(db_path, alike, 9 + 30 / 86400)  # ended 29 s before the owing run began
        _ended_days_ago(db_path, owing, 9)
        assert sum(store.remove_old_runs("s", timedelta(days=7))) == 1
        assert _kept(store, older, alike, owing) == [alike, owing]

    def test_runs_begun_since_a_scheduled_nights_fire_stay(self, store: RunStore, db_path: Path) -> None:
        """`keep_begun_since`: runs begun since a scheduled night's fire (which that night reads) stay, however long ago they ended."""
        before_the_fire, since_the_fire = _an_ended_run(store), _an_ended_run(store)
        _ended_days_ago(db_path, before_the_fire, 10)
        _ended_days_ago(db_path, since_the_fire, 8)
        fire = datetime.now(timezone.utc) - timedelta(days=9)
        assert sum(store.remove_old_runs("s", timedelta(days=7), keep_begun_since=fire)) == 1
        assert _kept(store, before_the_fire, since_the_fire) == [since_the_fire]


class TestWorstSignal:
    def test_severe_beats_a_later_warning(self) -> None:
        """A severe signal outranks a warning that came after it."""
        severe = Signal(Level.SEVERE, "loop", "stuck")
        assert worst_signal([severe, Signal(Level.WARNING, "slow", "slow")]) == severe

    def test_latest_wins_among_equals(self) -> None:
        """Among signals of the same level, the last one is chosen."""
        last = Signal(Level.WARNING, "b", "second")
        assert worst_signal([Signal(Level.WARNING, "a", "first"), last]) == last

    def test_no_signals(self) -> None:
        """An iteration without signals has no worst signal."""
        assert worst_signal([]) is None


class TestWhereTheStoreIs:
    @pytest.mark.parametrize(
        "url", ["sqlite:///runs.db", "sqlite:///file:runs.db?mode=rwc&uri=true", "sqlite:///file:sub%20dir/runs.db?uri=true"]
    )
    def test_a_relative_sqlite_store_is_beside_the_config_whatever_the_folder(self, tmp_path: Path, monkeypatch, url) -> None:
        """In SQLite's URI form a relative store was opened in the folder the command ran in: cron's night and
        the person's report, started from different folders, read different stores."""
        from orchestrator.config import load_config
        from runs.engine import sqlite_files

        folder, elsewhere = tmp_path / "config", tmp_path / "elsewhere"
        (folder / "sub dir").mkdir(parents=True)
        elsewhere.mkdir()
        (folder / "overnight.toml").write_text(f'[state]\ndir = "state"\n[store]\nurl = "{url}"\n')
        monkeypatch.chdir(elsewhere)
        config = load_config(folder / "overnight.toml", require_tasks=False)
        expected = folder / ("sub dir" if "sub" in url else "") / "runs.db"
        assert sqlite_files(config.store_url)[0] == expected
        RunStore.open(config.store_url).close()
        assert expected.is_file() and list(elsewhere.iterdir()) == []

    def test_an_absolute_uri_is_left_as_written(self, tmp_path: Path) -> None:
        from orchestrator.config import load_config
        from runs.engine import sqlite_files

        for url, files in ((f"sqlite:///file:{tmp_path}/abs.db?uri=true", [tmp_path / "abs.db"]),):
            (tmp_path / "overnight.toml").write_text(f'[state]\ndir = "state"\n[store]\nurl = "{url}"\n')
            config = load_config(tmp_path / "overnight.toml", require_tasks=False)
            assert config.store_url == url and sqlite_files(config.store_url)[:1] == files


    @pytest.mark.parametrize("url", ["sqlite:///file:runs.db", "sqlite:///~/home.db", "sqlite:///file:~/home.db?uri=true"])
    def test_the_store_opened_is_the_one_named(self, tmp_path: Path, monkeypatch, url) -> None:
        """Without `uri=true` SQLite takes `file:runs.db` for a file of that name, but it was read as a URI
        (a file `file%3A...` that could not be opened, exit 4); `~` was the home folder to overnight (which
        file is the store, what --junit may not replace) and a folder named `~` to SQLite."""
        from orchestrator.config import load_config
        from runs.engine import sqlite_files

        folder, home = tmp_path / "config", tmp_path / "home"
        folder.mkdir()
        home.mkdir()
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.chdir(tmp_path)
        (folder / "overnight.toml").write_text(f'[state]\ndir = "state"\n[store]\nurl = "{url}"\n')
        config = load_config(folder / "overnight.toml", require_tasks=False)
        expected = folder / "file:runs.db" if "uri" not in url and "file:" in url else home / "home.db"
        assert sqlite_files(config.store_url)[0] == expected
        RunStore.open(config.store_url).close()
        assert expected.is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["config", "home"]
        assert sorted(p.name for p in folder.iterdir()) == sorted(["overnight.toml", *([expected.name] if expected.parent == folder else [])])


    @pytest.mark.parametrize(
        "name",
        ["notes.md", "overnight.lock", "state-id", "worktrees/t/runs.db", "overnight.toml", "serve-night-started", "git-config.kept", "llama-server.log"],
    )
    def test_a_store_named_as_one_of_overnights_own_files_is_refused(self, tmp_path: Path, name: str) -> None:
        """`[store] url = "sqlite:///state/notes.md"`: the notes appended after the database's pages were cut off
        at its next close. Refused before anything is made: exit 2, one line naming the key."""
        import subprocess
        import sys

        from tests.conftest import SAMPLE_FILES, make_repo, write_config

        repo = make_repo(tmp_path / "repo", SAMPLE_FILES)
        where = name if name == "overnight.toml" else f"state/{name}"
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, extra=f'\n[store]\nurl = "sqlite:///{where}"\n')
        before = config.read_bytes()
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config)],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60,
        )
        assert done.returncode == 2, done.stderr
        [line] = done.stderr.strip().splitlines()
        assert "[store] url" in line and "own files" in line
        assert config.read_bytes() == before and not (tmp_path / "state" / name).exists()


class TestSomeOtherDatabase:
    def test_a_table_of_another_programs_is_left_as_it_is(self, tmp_path: Path) -> None:
        """A `runs` table of some other program's at the store's path: even `report` added overnight's columns
        to it and made overnight's other tables beside it. Now one line (StateError, exit 4), nothing made."""
        database = tmp_path / "runs.db"
        with sqlite3.connect(database) as db:
            db.execute("CREATE TABLE runs(x)")
        for open_store in (RunStore.open, RunStore.open_for_reading):
            with pytest.raises(StateError, match="'runs' that is not overnight's"):
                open_store(f"sqlite:///{database}")
        with sqlite3.connect(database) as db:
            assert db.execute("SELECT name, sql FROM sqlite_master").fetchall() == [("runs", "CREATE TABLE runs(x)")]
