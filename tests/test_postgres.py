"""The run store on a real PostgreSQL (`[store] url`, machines sharing the work): a throwaway
cluster of the test session (tests/conftest.py: postgres_url), a fresh database per test."""

from __future__ import annotations

import importlib
import multiprocessing
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import load_config
from orchestrator.errors import StateError
from orchestrator.notes import NotesBook
from orchestrator.records import Level
from orchestrator.scripted import call
from runs import RunStore
from runs.models import utc_now
from tests.conftest import git
from tests.test_faults import dead_pid, recover, winners_of_a_race
from tests.test_keep_runs import assert_the_newest_finish_of_each_work_stays
from tests.test_night import FIX, overnight, report_json
from tests.test_shared_store import a_dead_night_of, assert_the_column_was_added, clone, dead_owner, night_losing_its_lease, shared_config


@pytest.fixture
def store(pg_store_url: str):
    opened = RunStore.open(pg_store_url)
    yield opened
    opened.close()


def sql(url: str, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    """One statement on the database behind a store URL, autocommitted, past the store."""
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as connection:
        cursor = connection.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def _open_after(url: str, barrier: Any) -> None:
    barrier.wait(timeout=30)
    RunStore.open(url).close()


def open_at_once(url: str, processes: int = 8) -> list[int | None]:
    """Exit codes of `processes` forked processes that each open the store at the same moment."""
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(processes)
    openers = [context.Process(target=_open_after, args=(url, barrier)) for _ in range(processes)]
    for opener in openers:
        opener.start()
    for opener in openers:
        opener.join(60)
    return [opener.exitcode for opener in openers]


def _report_json_as(config: Path, store_url: str) -> Any:
    """`overnight report --json` run by its CLI with `config`'s store at `store_url` (a role's login)."""
    import json
    import subprocess
    import sys

    with config.open("a") as settings:
        settings.write(f"\n[store]\nurl = {json.dumps(store_url)}\n")
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "report", "--config", str(config), "--json"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60,
    )


def _older_store_and_a_role_not_owning_it(url: str, grants: str, *, read_only: bool) -> str:
    """The store at `url` as an older version left it (no ix_task_runs_work_key), and the URL of a new role granted
    `grants` on its tables, which it does not own (read-only in every transaction, if `read_only`)."""
    import uuid

    from sqlalchemy.engine import make_url

    sql(url, "DROP INDEX ix_task_runs_work_key")
    role = f"night_{uuid.uuid4().hex[:8]}"
    sql(url, f"CREATE ROLE {role} LOGIN")
    sql(url, f"GRANT {grants} ON ALL TABLES IN SCHEMA public TO {role}")
    sql(url, f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}")
    if read_only:
        sql(url, f"ALTER ROLE {role} SET default_transaction_read_only = on")
    return make_url(url).set(username=role).render_as_string(hide_password=False)


class TestRoundTrip:
    def test_a_whole_run_reads_back_as_written(self, store: RunStore) -> None:
        """Runs, tasks, iterations and their events go in and come back out, datetimes aware UTC."""
        run = store.begin_run(config_path="/repo/overnight.toml", pid=100, host="box", state_id="s1")
        task = store.begin_task(run, name="fix-bug", branch="overnight/fix-bug")
        first = store.begin_iteration(task, number=1, checkpoint="abc", pid=101, transcript="t.jsonl")
        store.record_model_call(first, prompt_tokens=10, completion_tokens=5, latency_ms=30, finish_reason="tool_calls", data={"k": [1, "é"]})
        store.record_tool_call(first, name="read_file", ok=True, message="contents")
        store.record_signal(first, level=Level.WARNING, kind="loop", message="same call twice")
        store.finish_iteration(first, outcome="rolled_back", reason="check_failed", correction="try again", turns=3, tokens=15)
        second = store.begin_iteration(task, number=2, checkpoint="abc", pid=101)
        store.heartbeat(second)
        store.finish_iteration(second, outcome="committed", commit="def", turns=2, tokens=9)
        store.finish_task(task, outcome="succeeded", commit="def")
        store.finish_run(run, status="finished", exit_code=0)

        view = store.latest_run()
        assert (view.id, view.status, view.exit_code, view.state_id, view.host) == (run, "finished", 0, "s1", "box")
        [task_view] = view.tasks
        assert (task_view.outcome, task_view.commit) == ("succeeded", "def")
        one, two = task_view.iterations
        assert (one.outcome, one.reason, one.correction, one.turns, one.tokens) == ("rolled_back", "check_failed", "try again", 3, 15)
        assert (one.model_calls, one.tool_calls, [s.kind for s in one.signals]) == (1, 1, ["loop"])
        assert (two.outcome, two.commit, two.model_calls) == ("committed", "def", 0)
        assert view.started_at.utcoffset() == timedelta(0) and one.finished_at >= one.started_at
        assert [it.number for it in store.iterations_for_task("fix-bug")] == [2, 1]
        assert store.running_iterations() == [] and store.integrity_problems() == []

    def test_text_holding_nul_is_stored(self, store: RunStore, pg_store_url: str) -> None:
        """A NUL in a command's output or a correction (PostgreSQL's text refuses it) is written as \\x00, not a failed store."""
        run = store.begin_run(config_path="c", pid=1, host="h")
        iteration = store.begin_iteration(store.begin_task(run, name="t", branch="b"), number=1, checkpoint="c", pid=1)
        store.record_tool_call(iteration, name="run_command", ok=True, message="a\x00b", data={"output": "a\x00b"})
        store.finish_iteration(iteration, outcome="rolled_back", reason="check_failed", correction="got \x00 back")
        [view] = store.iterations_for_task("t")
        assert view.correction == "got \\x00 back" and view.tool_calls == 1
        assert sql(pg_store_url, "SELECT message FROM events") == [("a\\x00b",)]

    def test_latest_run_of_a_state_dir(self, store: RunStore) -> None:
        """latest_run(state_id=...) is that state dir's newest run (or an unnamed older one), not the store's newest."""
        old = store.begin_run(config_path="c", pid=1, host="h")
        mine = store.begin_run(config_path="c", pid=1, host="h", state_id="mine")
        theirs = store.begin_run(config_path="c", pid=1, host="h", state_id="theirs")
        assert store.latest_run().id == theirs
        assert store.latest_run(state_id="mine").id == mine
        assert store.latest_run(state_id="nobody").id == old
        assert store.latest_run(state_id=None).id == old

    def test_the_slowest_iteration_of_earlier_runs_tonight(self, store: RunStore, pg_store_url: str) -> None:
        """A night begun again reads its fire's earlier iterations' times back aware (a naive one less an aware one
        is a TypeError): the slowest ended one, an interrupted one until its last heartbeat, a cancelled one until
        its last answer, not a wait for an unreachable model."""
        since = utc_now() - timedelta(hours=1)
        earlier = store.begin_run(config_path="c", pid=1, host="h", state_id="s")
        task = store.begin_task(earlier, name="t", branch="b", work_key="k")
        worked = store.begin_iteration(task, number=1, checkpoint="c", pid=1)
        store.finish_iteration(worked, outcome="rolled_back", reason="check_failed", at=store.now() + timedelta(minutes=3))
        waited = store.begin_iteration(task, number=2, checkpoint="c", pid=1)
        store.finish_iteration(waited, outcome="rolled_back", reason="model_unreachable", at=store.now() + timedelta(minutes=40))
        died = store.begin_iteration(task, number=3, checkpoint="c", pid=1)
        sql(pg_store_url, "UPDATE iterations SET heartbeat_at = started_at + interval '4 minutes' WHERE id = %s", died)
        assert store.interrupt_iteration(died, correction="x")
        cut = store.begin_iteration(task, number=4, checkpoint="c", pid=1)
        store.record_model_call(cut, prompt_tokens=1, completion_tokens=1, latency_ms=1)
        store.flush()
        store.finish_iteration(cut, outcome="cancelled", reason="cancelled", at=store.now() + timedelta(hours=3))
        sql(pg_store_url, "UPDATE events SET at = (SELECT started_at FROM iterations WHERE id = %s) + interval '5 minutes'", cut)
        now = store.begin_run(config_path="c", pid=2, host="h", state_id="s")
        assert store.earlier_tonight("s", since, now).slowest_iteration_s == 300

    def test_a_failed_write_is_one_line(self, store: RunStore) -> None:
        """A row the database refuses (no such iteration) is a one-line StateError, and the store goes on."""
        store.record_tool_call(999, name="read_file", ok=True)
        with pytest.raises(StateError, match="foreign key") as caught:
            store.flush()
        assert "\n" not in str(caught.value)
        assert store.latest_run() is None


class TestLeases:
    def test_acquire_renew_release(self, store: RunStore) -> None:
        """A free lease is taken; its holder renews and re-takes it; another cannot; once released another can."""
        assert store.acquire_lease("t", "a", ttl_s=60)
        assert store.acquire_lease("t", "a", ttl_s=60) and not store.acquire_lease("t", "b", ttl_s=60)
        before = store.leases()[0].expires_at
        assert store.renew_lease("t", "a", ttl_s=120) and store.leases()[0].expires_at > before
        assert not store.renew_lease("t", "b", ttl_s=60)
        store.release_lease("t", "b")  # not theirs: nothing happens
        assert [lease.owner for lease in store.leases()] == ["a"]
        store.release_lease("t", "a")
        assert store.leases() == [] and store.acquire_lease("t", "b", ttl_s=60)

    def test_an_expired_lease_is_taken_over(self, store: RunStore) -> None:
        """Once its ttl has passed a lease goes to the next taker, and the old holder can no longer renew it."""
        assert store.acquire_lease("t", "a", ttl_s=0.05)
        time.sleep(0.1)
        assert store.acquire_lease("t", "b", ttl_s=60)
        assert not store.renew_lease("t", "a", ttl_s=60)
        assert [lease.owner for lease in store.leases()] == ["b"]

    def test_two_takers_of_an_expired_lease_only_one_wins(self, pg_store_url: str) -> None:
        """Workers of several processes' stores racing for one expired lease: exactly one gets it, every time."""
        stores = [RunStore.open(pg_store_url) for _ in range(6)]
        try:
            for round_ in range(10):
                task = f"task-{round_}"
                assert stores[0].acquire_lease(task, "old", ttl_s=0.01)
                time.sleep(0.05)
                won = winners_of_a_race(stores, lambda store, index: store.acquire_lease(task, f"taker-{index}", ttl_s=60))
                assert len(won) == 1, f"round {round_}: {won} all took it"
                assert [lease.owner for lease in stores[0].leases() if lease.task == task] == [f"taker-{won[0]}"]
        finally:
            for opened in stores:
                opened.close()


class TestRecovery:
    def test_recoveries_of_one_dead_run_at_once_record_its_never_begun_tasks_once(self, pg_store_url: str) -> None:
        """Several machines' stores closing one dead run at the same moment: each task it never began gets one row, every time."""
        stores = [RunStore.open(pg_store_url) for _ in range(6)]
        queued = [{"name": name, "branch": f"overnight/{name}", "work_key": name} for name in ("one", "two", "three")]
        try:
            for round_ in range(10):
                run_id = stores[0].begin_run(config_path="c", pid=1, host="dead", state_id="s", queued=queued)
                stores[0].begin_task(run_id, name="one", branch="overnight/one")
                told = winners_of_a_race(stores, lambda store, index: store.close_interrupted_run(run_id, never_begun_reason="night_crashed"))
                assert len(told) == 1, f"round {round_}: {told} each recorded the never-begun tasks"
                rows = sql(pg_store_url, "SELECT name, outcome FROM task_runs WHERE run_id = %s ORDER BY id", run_id)
                assert rows == [("one", "failed"), ("two", "cancelled"), ("three", "cancelled")], f"round {round_}"
        finally:
            for opened in stores:
                opened.close()

    def test_a_dead_run_whose_task_waited_for_a_lease_ends_at_its_heartbeat(self, pg_store_url: str) -> None:
        """On PostgreSQL too (a store an older version made, without the column, gets it): a dead run whose task only
        waited for a lease ends at its latest heartbeat, not at the wait's start."""
        older = RunStore.open(pg_store_url)
        older.close()
        sql(pg_store_url, "ALTER TABLE runs DROP COLUMN heartbeat_at")
        store = RunStore.open(pg_store_url)
        try:
            run_id = store.begin_run(config_path="c", pid=1, host="dead", state_id="s")
            store.wait_task_for_lease(store.begin_task(run_id, name="one", branch="overnight/one"))
            time.sleep(0.05)
            store.heartbeat_run(run_id)
            [(beat,)] = sql(pg_store_url, "SELECT heartbeat_at FROM runs WHERE id = %s", run_id)
            store.close_interrupted_run(run_id)
            run = store.run(run_id)
            assert run.finished_at == beat > run.tasks[0].started_at
            assert [(task.outcome, task.reason, task.finished_at) for task in run.tasks] == [("skipped", "leased", beat)]
        finally:
            store.close()


# The run store's modules that read this host's clock (runs.models.utc_now).
HOST_CLOCK_READERS = ("runs.store", "runs.store_transactions", "runs.lease_rows", "runs.recovery_rows")


def set_host_clock(monkeypatch: Any, clock: Any) -> None:
    """This process's clock, wherever the run store reads it, made `clock`."""
    for module in HOST_CLOCK_READERS:
        monkeypatch.setattr(importlib.import_module(module), "utc_now", clock)


class TestOneClock:
    """Machines sharing a PostgreSQL store may disagree about the time; leases go by the database's.

    A second host's clock is stood in for by this process's, as the store reads it (`set_host_clock`), shifted
    by two minutes (twice the default ttl) for the second store's calls only.
    """

    def test_a_host_whose_clock_runs_ahead_cannot_take_a_live_lease(self, pg_store_url: str, monkeypatch) -> None:
        """Its clock says the holder's lease ran out; the database says it has 60 s left: the lease stays."""
        here, there = RunStore.open(pg_store_url), RunStore.open(pg_store_url)
        try:
            assert here.acquire_lease("t", "here", ttl_s=60)
            set_host_clock(monkeypatch, lambda: utc_now() + timedelta(seconds=120))
            assert not there.acquire_lease("t", "there", ttl_s=60)
            set_host_clock(monkeypatch, utc_now)
            assert [lease.owner for lease in here.leases()] == ["here"] and here.renew_lease("t", "here", ttl_s=60)
        finally:
            here.close()
            there.close()

    def test_a_host_whose_clock_runs_behind_keeps_its_lease_alive(self, pg_store_url: str, monkeypatch) -> None:
        """Its renewals, by its own clock, would write an expiry already past; by the database's the lease lives on."""
        holder, other = RunStore.open(pg_store_url), RunStore.open(pg_store_url)
        try:
            set_host_clock(monkeypatch, lambda: utc_now() - timedelta(seconds=120))
            assert holder.acquire_lease("t", "holder", ttl_s=60) and holder.renew_lease("t", "holder", ttl_s=60)
            set_host_clock(monkeypatch, utc_now)
            assert not other.acquire_lease("t", "other", ttl_s=60)
            [lease] = other.leases()
            assert lease.owner == "holder" and lease.expires_at - lease.acquired_at >= timedelta(seconds=59)
        finally:
            holder.close()
            other.close()


    def test_work_another_host_finished_tonight_is_seen_whatever_its_clock_says(self, pg_store_url: str, monkeypatch) -> None:
        """Machine A's night begins; machine B, whose clock runs ten minutes behind, then finishes the same
        work. By B's clock it finished before A's night began; by the database's, after: A skips it."""
        here = RunStore.open(pg_store_url)
        set_host_clock(monkeypatch, lambda: utc_now() - timedelta(minutes=10))
        there = RunStore.open(pg_store_url)
        try:
            set_host_clock(monkeypatch, utc_now)
            night = here.begin_run(config_path="a.toml", pid=1, host="machine-a", state_id="a" * 32)
            set_host_clock(monkeypatch, lambda: utc_now() - timedelta(minutes=10))
            other = there.begin_run(config_path="b.toml", pid=1, host="machine-b", state_id="b" * 32)
            task = there.begin_task(other, name="fix", branch="overnight/fix", work_key="k" * 32)
            there.finish_task(task, outcome="succeeded", commit="c" * 40)
            set_host_clock(monkeypatch, utc_now)
            assert here.succeeded_elsewhere("k" * 32, night) == "machine-b"
            [(started, database_now)] = sql(pg_store_url, "SELECT started_at, now() FROM runs WHERE id = %s", other)
            assert abs(started.replace(tzinfo=database_now.tzinfo) - database_now) < timedelta(minutes=1)
        finally:
            here.close()
            there.close()

class TestRemoveOldRuns:
    def test_a_state_dirs_old_runs_go_with_all_their_rows(self, store: RunStore, pg_store_url: str) -> None:
        """`[state] keep_runs_days` on PostgreSQL: the state dir's run that ended long ago (by the database's clock) goes
        with its task, iteration and events; another state dir's as old and a recent one stay."""

        def a_run(state_id: str) -> int:
            run = store.begin_run(config_path="c.toml", pid=1, host="h", state_id=state_id)
            task = store.begin_task(run, name="t", branch="overnight/t")
            iteration = store.begin_iteration(task, number=1, checkpoint="c", pid=1)
            store.record_model_call(iteration, prompt_tokens=1, completion_tokens=1, latency_ms=1)
            store.finish_iteration(iteration, outcome="rolled_back", reason="check_failed")
            store.finish_task(task, outcome="failed", reason="check_failed")
            store.finish_run(run, status="finished", exit_code=1)
            return run

        old, another, recent = a_run("s"), a_run("another"), a_run("s")
        sql(pg_store_url, "UPDATE runs SET started_at = now() - interval '10 days', finished_at = now() - interval '10 days' WHERE id IN (%s, %s)", old, another)
        assert list(store.remove_old_runs("s", timedelta(days=7))) == [1]
        assert store.run(old) is None and store.run(another) is not None and store.run(recent) is not None
        assert [sql(pg_store_url, f"SELECT count(*) FROM {table}")[0][0] for table in ("task_runs", "iterations", "events")] == [2, 2, 2]

    def test_the_newest_finish_of_each_work_stays_in_a_shared_store(self, store: RunStore) -> None:
        """In a shared store on PostgreSQL, an old run stays only while it holds the store's newest finish with success of a work."""
        assert_the_newest_finish_of_each_work_stays(store)


class TestSchema:
    def test_processes_opening_a_new_store_at_once_all_succeed(self, pg_store_url: str) -> None:
        """Each sees the tables missing and creates them; the others must not fail on PostgreSQL's duplicate catalog rows."""
        for attempt in range(3):
            assert open_at_once(pg_store_url) == [0] * 8, f"attempt {attempt}"
            sql(pg_store_url, "DROP TABLE events, leases, iterations, task_runs, runs")

    def test_an_older_store_gets_the_column_even_when_opened_at_once(self, pg_store_url: str) -> None:
        """A runs table without `state_id` gets it from whichever process opens it first; its runs still read."""
        store = RunStore.open(pg_store_url)
        run = store.begin_run(config_path="c", pid=1, host="h")
        store.close()
        sql(pg_store_url, "ALTER TABLE runs DROP COLUMN state_id")
        assert open_at_once(pg_store_url) == [0] * 8
        assert_the_column_was_added(pg_store_url, run)

    def test_adding_a_column_gives_up_on_a_table_another_session_holds(self, pg_store_url: str, monkeypatch) -> None:
        """A psql session left in a transaction that read the table: ALTER waited for it without end (and every
        machine's statements behind the ALTER with it). It gives up after its lock timeout, in one line."""
        import time

        import psycopg

        import runs.schema

        store = RunStore.open(pg_store_url)
        store.begin_run(config_path="c", pid=1, host="h")
        store.close()
        sql(pg_store_url, "ALTER TABLE runs DROP COLUMN state_id")
        monkeypatch.setattr(runs.schema, "MIGRATION_LOCK_TIMEOUT_S", 0.5)
        with psycopg.connect(pg_store_url.replace("postgresql+psycopg://", "postgresql://")) as idle_in_transaction:
            idle_in_transaction.execute("SELECT count(*) FROM runs").fetchall()
            started = time.monotonic()
            with pytest.raises(StateError, match="another session's open transaction") as caught:
                RunStore.open(pg_store_url)
            assert time.monotonic() - started < 10 and "\n" not in str(caught.value)
        RunStore.open(pg_store_url).close()
        assert sql(pg_store_url, "SELECT count(*) FROM information_schema.columns WHERE table_name = 'runs' AND column_name = 'state_id'") == [(1,)]

    def test_an_older_store_gets_the_work_key_index_even_when_opened_at_once(self, pg_store_url: str) -> None:
        """task_runs without ix_task_runs_work_key (an older version's store) get it from whichever process opens it
        first; the others, opening at the same moment, all succeed too."""
        RunStore.open(pg_store_url).close()
        sql(pg_store_url, "DROP INDEX ix_task_runs_work_key")
        assert open_at_once(pg_store_url) == [0] * 8
        assert sql(pg_store_url, "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_task_runs_work_key'") == [
            ("CREATE INDEX ix_task_runs_work_key ON public.task_runs USING btree (work_key, outcome, finished_at)",)
        ]

    def test_an_index_waits_briefly_for_a_table_another_session_holds_then_the_store_opens_without_it(self, pg_store_url: str, monkeypatch) -> None:
        """A session left in a transaction that wrote to task_runs: CREATE INDEX would wait for it without end (and
        every machine's writes to task_runs behind it). It gives up after its short lock timeout and the store opens
        without the index (only for speed), with a warning; the next open adds it."""
        import psycopg
        from structlog.testing import capture_logs

        import runs.schema

        RunStore.open(pg_store_url).close()
        sql(pg_store_url, "DROP INDEX ix_task_runs_work_key")
        monkeypatch.setattr(runs.schema, "INDEX_LOCK_TIMEOUT_S", 0.5)
        with psycopg.connect(pg_store_url.replace("postgresql+psycopg://", "postgresql://")) as idle_in_transaction:
            idle_in_transaction.execute("UPDATE task_runs SET reason = '' WHERE false")
            started = time.monotonic()
            with capture_logs() as logs:
                store = RunStore.open(pg_store_url)
            try:
                assert time.monotonic() - started < 10
                assert [(log["event"], log["index"]) for log in logs] == [("store_index_not_added", "ix_task_runs_work_key")]
                assert "another session's open transaction" in logs[0]["error"] and "\n" not in logs[0]["error"]
            finally:
                store.close()
        assert sql(pg_store_url, "SELECT count(*) FROM pg_indexes WHERE indexname = 'ix_task_runs_work_key'") == [(0,)]
        RunStore.open(pg_store_url).close()
        assert sql(pg_store_url, "SELECT count(*) FROM pg_indexes WHERE indexname = 'ix_task_runs_work_key'") == [(1,)]

    @pytest.mark.parametrize(
        "grants, read_only",
        [("SELECT, INSERT, UPDATE, DELETE", False), ("SELECT", True)],
        ids=["a night's role that does not own the tables", "a read-only role reading the report"],
    )
    def test_a_role_that_may_not_add_the_index_still_opens_an_older_store(self, pg_store_url: str, grants: str, read_only: bool) -> None:
        """A `[store] url` whose role may use the tables but not add an index to them (another role owns them on a
        shared server; a read-only role, for `report`) opens an older version's store, without ix_task_runs_work_key,
        as it did before the index: the index is only for speed, so the store is used without it (a warning says so)."""
        from structlog.testing import capture_logs

        store = RunStore.open(pg_store_url)
        run = store.begin_run(config_path="c", pid=1, host="h")
        store.close()
        as_role = _older_store_and_a_role_not_owning_it(pg_store_url, grants, read_only=read_only)
        with capture_logs() as logs:
            store = RunStore.open_for_reading(as_role) if read_only else RunStore.open(as_role)
        assert [(log["event"], log["index"], log["log_level"]) for log in logs] == [("store_index_not_added", "ix_task_runs_work_key", "warning")]
        try:
            if not read_only:
                run = store.begin_run(config_path="c", pid=1, host="h")
            assert store.latest_run().id == run
        finally:
            store.close()
        assert sql(pg_store_url, "SELECT count(*) FROM pg_indexes WHERE indexname = 'ix_task_runs_work_key'") == [(0,)]

    @pytest.mark.parametrize("read_only", [True, False], ids=["a read-only role", "a role that may read the tables only"])
    def test_the_report_of_a_role_that_may_not_add_a_column_reads_an_older_store(self, tmp_path: Path, repo: Path, pg_store_url: str, read_only: bool) -> None:
        """`overnight report --json` as a role that may not alter the tables, on the store a version before `runs.deadline`
        made: it read it before that column, and must still (the column read as null, a warning on stderr); it failed
        in one line, exit 4, "cannot execute ALTER TABLE in a read-only transaction" / "must be owner of table runs"."""
        import json

        from orchestrator.lock import state_identity
        from tests.conftest import write_config

        store = RunStore.open(pg_store_url)
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9", repo=repo)
        (config.parent / "state").mkdir()
        run = store.begin_run(config_path=str(config), pid=1, host="h", state_id=state_identity(config.parent / "state"))
        task = store.begin_task(run, name="late", branch="overnight/late")
        store.finish_task(task, outcome="cancelled", reason="deadline")
        store.finish_run(run, status="cancelled", exit_code=3)
        store.close()
        sql(pg_store_url, "ALTER TABLE runs DROP COLUMN deadline")
        as_role = _older_store_and_a_role_not_owning_it(pg_store_url, "SELECT", read_only=read_only)
        done = _report_json_as(config, as_role)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert (report["run"]["id"], report["run"]["deadline"]) == (run, {"at": None, "cut_short": [], "not_started": ["late"]})
        assert '"store_column_not_added"' in done.stderr
        assert sql(pg_store_url, "SELECT count(*) FROM information_schema.columns WHERE table_name = 'runs' AND column_name = 'deadline'") == [(0,)]
        # A night needs the column: its open as such a role still fails, in one line, and adds nothing.
        with pytest.raises(StateError, match="cannot open run store"):
            RunStore.open(as_role)

    def test_the_report_of_a_read_only_role_stays_json_when_the_index_is_not_added(self, tmp_path: Path, repo: Path, pg_store_url: str) -> None:
        """`overnight report --json` as a read-only role on an older version's store: stdout is the report alone, the
        `store_index_not_added` warning goes to stderr (the report's command had set no logging up: stdout had it)."""
        import json

        from orchestrator.lock import state_identity
        from tests.conftest import write_config

        store = RunStore.open(pg_store_url)
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9", repo=repo)
        (config.parent / "state").mkdir()
        run = store.begin_run(config_path=str(config), pid=1, host="h", state_id=state_identity(config.parent / "state"))
        store.finish_run(run, status="finished", exit_code=0)
        store.close()
        as_role = _older_store_and_a_role_not_owning_it(pg_store_url, "SELECT", read_only=True)
        done = _report_json_as(config, as_role)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["run"]["id"] == run
        assert "store_index_not_added" in done.stderr

    def test_a_connection_the_network_drops_is_given_up_in_bounded_time(self, store: RunStore, pg_store_url: str) -> None:
        """libpq's keepalives and TCP user timeout are on the store's connections (a partition would
        otherwise block a call for as long as TCP retries); a URL's own values win."""
        with store._engine.connect() as connection:
            parameters = connection.connection.dbapi_connection.info.get_parameters()
        assert (parameters["keepalives_idle"], parameters["keepalives_count"], parameters["tcp_user_timeout"]) == ("30", "3", "60000")
        own = RunStore.open(f"{pg_store_url}?tcp_user_timeout=5000")
        try:
            with own._engine.connect() as connection:
                assert connection.connection.dbapi_connection.info.get_parameters()["tcp_user_timeout"] == "5000"
        finally:
            own.close()

    def test_serves_job_store_has_the_same_bounds(self, pg_store_url: str, tmp_path: Path) -> None:
        """`serve`'s job store, on the same database, had none: a partition hung its scheduler thread."""
        from orchestrator.schedule_store import job_store
        from tests.test_schedule import write_schedule_config

        path = write_schedule_config(tmp_path / "night", cron="0 1 * * *")
        path.write_text(path.read_text(encoding="utf-8").replace("[state]", f'[store]\nurl = "{pg_store_url}"\n[state]', 1), encoding="utf-8")
        jobs = job_store(load_config(path))
        with jobs.engine.connect() as connection:
            parameters = connection.connection.dbapi_connection.info.get_parameters()
        jobs.engine.dispose()
        assert (parameters["connect_timeout"], parameters["keepalives_idle"], parameters["tcp_user_timeout"]) == ("20", "30", "60000")

    def test_a_missing_database_is_one_line(self, postgres_url: str) -> None:
        """A database that does not exist is StateError naming the URL (password hidden), not a traceback."""
        url = postgres_url.replace("postgres@", "postgres:secret@") + "/no_such_database"
        with pytest.raises(StateError, match="cannot open run store") as caught:
            RunStore.open(url)
        assert "secret" not in str(caught.value) and "\n" not in str(caught.value)

    def test_a_server_that_accepts_but_never_answers_is_one_line_not_a_hang(self) -> None:
        """A stuck host (or pooler) at night start: the connection gives up after its timeout, once (not again for
        each of the schema's attempts, which are for a race between processes creating it), and says so."""
        import socket
        import subprocess
        import sys

        silent = socket.create_server(("127.0.0.1", 0))
        url = f"postgresql+psycopg://u@127.0.0.1:{silent.getsockname()[1]}/db"
        opener = (
            "import sys; import runs.engine as engine; import runs.store as store; engine.CONNECT_TIMEOUT_S = 2\n"
            "try:\n    store.RunStore.open(sys.argv[1])\nexcept store.StateError as error:\n    print(error)"
        )
        try:
            started = time.monotonic()
            done = subprocess.run([sys.executable, "-c", opener, url], capture_output=True, text=True, timeout=30)
        finally:
            silent.close()
        assert time.monotonic() - started < 12  # one 2 s timeout and Python's start; each attempt again took 18 s
        assert "cannot open run store" in done.stdout and "Traceback" not in done.stderr


class TestNights:
    def test_a_whole_night_and_the_next_one_after_a_crash(self, tmp_path: Path, repo: Path, server: Any, pg_store_url: str, capsys) -> None:
        """`overnight run` with [store] url on PostgreSQL: B's night commits (through a command printing NUL);
        A's dead night, which B's report does not show, is settled by A's next `overnight run`, which does its own work."""
        config_a = shared_config(tmp_path / "a", repo, server, pg_store_url)
        with_commands = [{"name": "fix-greet", "prompt": "p", "check": "python check_greet.py", "tools": ["run_command", "read_file", "edit_file", "list_dir", "run_check"]}]
        config_b = shared_config(tmp_path / "b", clone(repo, tmp_path / "b-repo"), server, pg_store_url, tasks=with_commands)
        server.enqueue(call("run_command", {"command": "printf 'x\\0y'"}), *FIX)
        assert overnight("run", "--config", str(config_b)) == 0
        [task] = report_json(config_b, capsys)["tasks"]
        assert task["outcome"] == "succeeded" and task["commit"] == git(tmp_path / "b-repo", "rev-parse", "overnight/fix-greet")
        assert sql(pg_store_url, "SELECT message FROM events WHERE name = 'run_command'") == [("exit code 0\nx\\x00y",)]

        dead_run, dead_iteration = a_dead_night_of(config_a, pid=dead_pid())
        assert report_json(config_b, capsys)["run"]["status"] == "finished"
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config_a)) == 0
        assert sql(pg_store_url, "SELECT outcome FROM iterations WHERE id = %s", dead_iteration) == [("interrupted",)]
        assert sql(pg_store_url, "SELECT status FROM runs WHERE id = %s", dead_run) == [("crashed",)]
        report = report_json(config_a, capsys)
        assert report["run"]["status"] == "finished" and report["run"]["id"] > dead_run
        assert [t["outcome"] for t in report["tasks"]] == ["succeeded"]
        assert "return 'hello'" in git(repo, "show", "overnight/fix-greet:greet.py")
        assert sql(pg_store_url, "SELECT count(*) FROM leases") == [(0,)]

    def test_only_this_state_dirs_dead_leases_are_freed_early(self, tmp_path: Path, repo: Path, server: Any, pg_store_url: str) -> None:
        """Recovery frees its own state dir's dead lease at once; another state dir's waits for its ttl."""
        settings_a = load_config(shared_config(tmp_path / "a", repo, server, pg_store_url))
        settings_b = load_config(shared_config(tmp_path / "b", repo, server, pg_store_url))
        opened = RunStore.open(pg_store_url)
        try:
            own, other = dead_owner(settings_a.state_dir), dead_owner(settings_b.state_dir)
            assert opened.acquire_lease("mine", own, ttl_s=600) and opened.acquire_lease("theirs", other, ttl_s=600)
            recover(settings_a)
            assert [lease.task for lease in opened.leases()] == ["theirs"]
        finally:
            opened.close()

    def test_own_dead_night_is_settled_even_if_its_pid_is_alive(self, tmp_path: Path, repo: Path, server: Any, pg_store_url: str, sleeper) -> None:
        """Holding the state dir's lock proves its night dead, pid reused or not."""
        config = shared_config(tmp_path, repo, server, pg_store_url)
        run_id, iteration = a_dead_night_of(config, pid=sleeper.pid)
        [settled], _ = recover(load_config(config))
        assert settled.id == iteration and settled.outcome == "interrupted"
        assert sql(pg_store_url, "SELECT status FROM runs WHERE id = %s", run_id) == [("crashed",)]

    def test_a_worker_whose_lease_was_taken_over_does_not_commit(self, tmp_path: Path, repo: Path, server: Any, pg_store_url: str) -> None:
        """Another worker took the lease while the model was slow: the work is rolled back, not committed."""
        import psycopg

        config = shared_config(tmp_path, repo, server, pg_store_url)
        base = git(repo, "rev-parse", "HEAD")

        def steal() -> bool:
            try:
                return bool(sql(pg_store_url, "UPDATE leases SET owner = 'elsewhere:1:x:other' WHERE task LIKE 'fix-greet@%%' RETURNING task"))
            except psycopg.errors.UndefinedTable:  # the night has not opened the store yet
                return False

        task = night_losing_its_lease(config, server, steal)
        assert (task.outcome.value, task.reason) == ("cancelled", "lease_lost")
        assert git(repo, "rev-parse", "overnight/fix-greet") == base
        [entry] = NotesBook(tmp_path / "state" / "notes.md").entries()
        assert entry.reason == "cancelled" and "lease_lost" in entry.text
        assert sql(pg_store_url, "SELECT owner FROM leases") == [("elsewhere:1:x:other",)]  # the loser left it alone


class TestKilled:
    def test_nights_killed_at_random_points_leave_every_invariant_kept(self, tmp_path: Path, pg_store_url: str) -> None:
        """bench/kill.py --postgres's trials, three SIGKILLs of a real night (seed 3): after each recovery, no invariant is
        broken (the lock free, nothing left running, clean worktrees, no lost commit, notes whole, the store consistent)."""
        import random

        from bench.kill import calibrate, kill_trials, setup

        setup(tmp_path)
        calibration = calibrate(tmp_path, pg_store_url)
        trials = list(kill_trials(tmp_path, 3, calibration, random.Random(3), 0.2, pg_store_url))
        assert [found for _, _, found in trials] == [[], [], []], trials

    def test_a_night_killed_while_it_removes_old_runs_of_a_shared_store_leaves_whole_runs(self, tmp_path: Path, server: Any, pg_store_url: str) -> None:
        """bench/kill.py --old-runs --postgres's trial, one SIGKILL inside the removal: each old run is whole or gone, no
        row lost its parent, every run holding a work's newest finish (another state dir's finishing some last) stays;
        the next night removes the rest of the state dir's old runs, keeps those and exits 0."""
        import random

        from bench.kill_old_runs import kept_as_newest, kill_in_removal, removal_time, rest_removed, seed_old_runs, set_up

        setup = set_up(tmp_path, server, pg_store_url)
        within_s, rng, landings = removal_time(setup), random.Random(5), []
        while len(landings) < 3 and not any(landing.inside for landing in landings):
            seeded = seed_old_runs(setup)
            holders = kept_as_newest(setup, seeded)
            landing, torn = kill_in_removal(setup, seeded, within_s, rng)
            assert torn == [] and holders, (landing, torn)
            server.enqueue(*FIX)
            assert overnight("run", "--config", str(setup.config)) == 0
            assert rest_removed(setup, holders) == [], landing
            landings.append(landing)
            within_s /= 2
        assert any(landing.inside for landing in landings), landings
