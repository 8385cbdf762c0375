"""Faults a night must survive: a second run, kill -9, a dead worker's lease, an unusable state dir."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest
import sqlalchemy
import structlog

from orchestrator.command_environment import GIT_IDENTITY
from orchestrator.config import load_config
from orchestrator.errors import StateError
from orchestrator.leases import LeaseHeld, LeaseKeeper
from orchestrator.lock import LockHeld, StateLock, read_holder, state_identity
from orchestrator.notes import NotesBook
from orchestrator.recovery import recover_interrupted
from orchestrator.scripted import Reply, call
from orchestrator.worktree import Worktree
from runs import RunStore
from tests.conftest import git, make_repo, write_config
from tests.test_night import overnight, report_json

REPO_ROOT = Path(__file__).resolve().parents[1]
HOLD_LOCK = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from orchestrator.lock import StateLock
    with StateLock(Path(sys.argv[1])):
        print("locked", flush=True)
        time.sleep(60)
    """
)


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen]:
    """Another live process holding the lock of tmp_path/state."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(tmp_path / "state")], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def winners_of_a_race(stores: list[RunStore], take: Any) -> list[int]:
    """The indexes of `stores` for which `take(store, index)` returned true, each called from its own thread at one moment."""
    barrier, won = threading.Barrier(len(stores)), []

    def run(index: int) -> None:
        barrier.wait(timeout=10)
        if take(stores[index], index):
            won.append(index)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return won


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    return int(proc.stdout)


class TestStateLock:
    def test_second_run_is_refused_naming_the_holder(self, tmp_path: Path, holder: subprocess.Popen) -> None:
        """While another live process holds the lock, taking it raises LockHeld with one line naming pid and host."""
        with pytest.raises(LockHeld) as caught:
            with StateLock(tmp_path / "state"):
                pass
        message = str(caught.value)
        assert f"pid {holder.pid} on {socket.gethostname()} since " in message and "UTC" in message
        assert "\n" not in message and caught.value.holder.pid == holder.pid

    def test_a_read_only_look_at_the_state_dirs_name_makes_none(self, tmp_path: Path) -> None:
        """`create=False` (report, status) answers None for a state dir without a name and writes nothing there."""
        (tmp_path / "state").mkdir()
        assert state_identity(tmp_path / "state", create=False) is None
        assert list((tmp_path / "state").iterdir()) == []
        made = state_identity(tmp_path / "state")
        assert made and state_identity(tmp_path / "state", create=False) == made

    def test_lock_of_a_killed_process_is_taken_over(self, tmp_path: Path, holder: subprocess.Popen) -> None:
        """After kill -9 of the holder, the next run gets the lock and records itself as holder."""
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        with StateLock(tmp_path / "state") as lock:
            assert read_holder(lock.path).pid == os.getpid()

    def test_lock_is_exclusive_within_one_process_too(self, tmp_path: Path) -> None:
        """Two StateLocks on one state dir in the same process do not both succeed; release frees it."""
        with StateLock(tmp_path / "state") as first:
            with pytest.raises(LockHeld):
                StateLock(tmp_path / "state").__enter__()
        assert read_holder(first.path) is None
        with StateLock(tmp_path / "state"):
            pass

    def test_a_night_whose_state_dir_was_removed_stops_before_its_next_iteration(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """`rm -rf` of the state dir mid-night lets a second night lock a fresh file there: the first
        stops (StateError, exit 4) before starting another iteration, instead of working beside it."""
        from tests.test_unattended import run_in_process

        config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, night={"max_iterations": 3})
        state = tmp_path / "state"
        server.enqueue(*[call("submit", {"summary": "x"}, delay_s=0.5)] * 3)

        def replace_the_lock_file() -> None:
            _wait_for(lambda: len(server.requests) >= 1, 30, "the first model call")
            (state / "overnight.lock").rename(state / "overnight.lock.gone")
            (state / "overnight.lock").touch()  # what a second night's StateLock would lock

        with StateLock(state) as lock:
            threading.Thread(target=replace_the_lock_file).start()
            with pytest.raises(StateError, match="removed or replaced"):
                run_in_process(config, check_lock=lock.check_still_held)
        assert len(server.requests) == 1

    def test_state_dir_that_cannot_be_created_is_one_line(self, tmp_path: Path) -> None:
        """A state dir below a regular file gives a one-line StateError naming the path."""
        (tmp_path / "blocker").write_text("a file")
        with pytest.raises(StateError) as caught:
            with StateLock(tmp_path / "blocker" / "state"):
                pass
        assert "blocker/state" in str(caught.value) and "\n" not in str(caught.value)

    def test_cli_exits_4_when_state_dir_cannot_be_created(self, tmp_path: Path, repo: Path, capsys: Any) -> None:
        """`overnight run` with a state dir below a regular file exits 4 with one line on stderr."""
        (tmp_path / "blocker").write_text("a file")
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        config.write_text(config.read_text().replace('dir = "state"', 'dir = "blocker/state"'))
        code = overnight("run", "--config", str(config))
        err = capsys.readouterr().err.strip()
        assert code == 4 and len(err.splitlines()) == 1 and "blocker" in err

    @pytest.mark.parametrize("folder", ["worktrees", "transcripts"])
    def test_a_file_where_a_state_folder_goes_exits_4_before_any_run(self, tmp_path: Path, repo: Path, capsys: Any, folder: str) -> None:
        """A file named like one of the state dir's folders was a traceback (exit 1) mid-night; now one line, exit 4, nothing recorded."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        (tmp_path / "state").mkdir()
        (tmp_path / "state" / folder).write_text("a file")
        code = overnight("run", "--config", str(config))
        err = capsys.readouterr().err.strip()
        assert code == 4 and err.splitlines() == [err] and folder in err and "file is in the way" in err
        assert not (tmp_path / "state" / "runs.db").exists()

    @pytest.mark.parametrize("command", ["run", "gc"])
    def test_a_lock_file_that_is_a_symbolic_link_empties_nothing(self, tmp_path: Path, repo: Path, capsys: Any, command: str) -> None:
        """The holder is written over the lock file and it is emptied at release: through a link at
        `overnight.lock` (put there in a state dir others may write) that emptied the file it named.
        Now one line, exit 4, the file as it was and nothing recorded."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        precious = tmp_path / "precious.txt"
        precious.write_text("a person's work\n")
        (tmp_path / "state").mkdir()
        (tmp_path / "state" / "overnight.lock").symlink_to(precious)
        code = overnight(command, "--config", str(config))
        err = capsys.readouterr().err.strip()
        assert code == 4 and err.splitlines() == [err] and "overnight.lock" in err and "symbolic link" in err
        assert precious.read_text() == "a person's work\n"
        assert not (tmp_path / "state" / "runs.db").exists()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RunStore]:
    opened = RunStore.open(f"sqlite:///{tmp_path / 'state' / 'runs.db'}")
    yield opened
    opened.close()


class TestLeases:
    def test_only_one_owner_at_a_time(self, store: RunStore) -> None:
        """A held lease refuses another owner but lets its own owner take it again."""
        assert store.acquire_lease("t", "a", 30)
        assert not store.acquire_lease("t", "b", 30)
        assert store.acquire_lease("t", "a", 30)
        assert store.acquire_lease("other", "b", 30)

    def test_expired_lease_is_taken_over_and_the_old_owner_cannot_renew(self, store: RunStore) -> None:
        """After its ttl an unrenewed lease goes to the next taker, and the old owner's renewal fails."""
        assert store.acquire_lease("t", "a", 0.2)
        assert not store.acquire_lease("t", "b", 0.2)
        time.sleep(0.3)
        assert store.acquire_lease("t", "b", 30)
        assert not store.renew_lease("t", "a", 30)
        assert store.renew_lease("t", "b", 30)

    def test_a_leases_holder_is_named_only_while_it_holds_it(self, store: RunStore) -> None:
        """Asked without taking it, a lease names its owner until it expires or is given back, and nobody after."""
        assert store.lease_holder("t") is None
        assert store.acquire_lease("t", "a", 0.2)
        assert store.lease_holder("t") == "a" and store.lease_holder("other") is None
        time.sleep(0.3)
        assert store.lease_holder("t") is None
        assert store.acquire_lease("t", "b", 30)
        store.release_lease("t", "b")
        assert store.lease_holder("t") is None

    def test_release_frees_only_ones_own_lease(self, store: RunStore) -> None:
        """Releasing someone else's lease does nothing; releasing one's own frees the task."""
        assert store.acquire_lease("t", "a", 30)
        store.release_lease("t", "b")
        assert not store.acquire_lease("t", "b", 30)
        store.release_lease("t", "a")
        assert store.acquire_lease("t", "b", 30)

    def test_racing_threads_get_exactly_one_lease(self, tmp_path: Path) -> None:
        """Eight threads with their own connections racing for a free (then an expired) lease: one wins each time."""
        url = f"sqlite:///{tmp_path / 'race.db'}"
        stores = [RunStore.open(url) for _ in range(8)]
        try:
            # A ttl the race itself cannot outlast on a loaded machine: with 0.2 s, the first winner's
            # lease had expired before the last thread asked, and two won, rightly.
            for round_ in range(2):
                if round_:
                    time.sleep(1.6)  # every round-0 lease has expired
                wins = winners_of_a_race(stores, lambda store, index: store.acquire_lease("t", f"owner-{round_}-{index}", 1.5))
                assert len(wins) == 1
        finally:
            for each in stores:
                each.close()

    def test_an_expired_lease_deleted_while_it_is_asked_for_is_taken(self, tmp_path: Path) -> None:
        """A dead night's expired lease, released by another machine's recovery while this one asks for
        it, was takeable all along: acquiring it succeeds. The release is made once the database
        has refused an INSERT of the lease (SQLAlchemy's handle_error) and the taker's connection
        is back in its pool: a taker that inserted, then updated, met a row that was gone and took
        the free task for held."""
        url = f"sqlite:///{tmp_path / 'race.db'}"
        taker, recovering = RunStore.open(url), RunStore.open(url)
        try:
            assert recovering.acquire_lease("t", "dead-night", 0.05)
            time.sleep(0.1)
            refused = threading.Event()

            def note_refusal(context: Any) -> None:
                if "leases" in str(context.statement).lower():
                    refused.set()

            def release_between(*_: Any) -> None:
                if refused.is_set():
                    refused.clear()
                    recovering.release_lease("t", "dead-night")

            sqlalchemy.event.listen(taker._engine, "handle_error", note_refusal)
            sqlalchemy.event.listen(taker._engine, "checkin", release_between)
            assert taker.acquire_lease("t", "next-night", 30)
            assert [lease.owner for lease in taker.leases()] == ["next-night"]
        finally:
            taker.close()
            recovering.close()

    def test_keeper_renews_past_the_ttl_and_releases_at_exit(self, store: RunStore) -> None:
        """A LeaseKeeper keeps its lease alive for longer than the ttl, refuses a second keeper, and frees it on exit."""
        with LeaseKeeper(store, "t", ttl_s=0.3) as keeper:
            time.sleep(0.7)
            assert not store.acquire_lease("t", "intruder", 30)
            with pytest.raises(LeaseHeld, match=keeper.owner):
                with LeaseKeeper(store, "t", ttl_s=0.3):
                    pass
            assert not keeper.lost.is_set()
        assert store.leases() == []

    def test_keeper_never_lets_its_lease_lapse(self, store: RunStore) -> None:
        """Renewed well within its ttl: at no moment of a keeper's life can another worker take the task
        (renewing only once the ttl had passed would leave it free between the two)."""
        with LeaseKeeper(store, "t", ttl_s=1.5) as keeper:  # renewed every 0.5 s: a 1 s stall of its thread to fail
            until = time.monotonic() + 3.5
            while time.monotonic() < until:
                assert not store.acquire_lease("t", "intruder", 30)
                time.sleep(0.05)
            assert not keeper.lost.is_set()

    def test_keeper_notices_a_lost_lease(self, store: RunStore) -> None:
        """If someone else took the lease, the keeper's next renewal sets `lost` and calls on_lost."""
        called = threading.Event()
        with LeaseKeeper(store, "t", ttl_s=0.3, on_lost=called.set) as keeper:
            store.release_lease("t", keeper.owner)
            assert store.acquire_lease("t", "thief", 30)
            assert called.wait(2) and keeper.lost.is_set()
        assert [lease.owner for lease in store.leases()] == ["thief"]


def _config(tmp_path: Path, repo: Path, api_base: str = "http://127.0.0.1:9/v1", **night: Any):
    tasks = [
        {"name": "fix-greet", "prompt": "greet() should return 'hello'.", "check": "python check_greet.py"},
        {"name": "second", "prompt": "fix it too", "check": "python check_greet.py"},
    ]
    path = write_config(tmp_path / "overnight.toml", api_base=api_base, repo=repo, tasks=tasks, model={"request_timeout_s": 60}, night=night)
    return load_config(path)


def recover(config: Any) -> tuple[list[Any], list[dict[str, Any]]]:
    """What `overnight run` does first: take the lock, open the store, recover."""
    with StateLock(config.state_dir), structlog.testing.capture_logs() as logs:
        store = RunStore.open(config.store_url)
        try:
            return recover_interrupted(store, config, structlog.get_logger()), logs
        finally:
            store.close()


@contextlib.contextmanager
def _live_night_without_its_lock_file(config: Any, *, begun: bool = True) -> Iterator[tuple[int, RunStore, Worktree, int | None, str]]:
    """A night of `config`'s state dir at work in a live process (one that takes the state lock and sleeps
    stands for it): its run begun (unless not `begun`: still in its own recovery), the worktree of fix-greet
    made, then its `overnight.lock` deleted. Yields its pid, its store, that worktree, its run's id and the
    lease owner it would take leases as."""
    holds_the_lock = "import sys, time; from pathlib import Path; from orchestrator.lock import StateLock; StateLock(Path(sys.argv[1])).__enter__(); print('locked', flush=True); time.sleep(120)"
    live = subprocess.Popen(
        [sys.executable, "-c", holds_the_lock, str(config.state_dir)], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert live.stdout is not None and live.stdout.readline() == "locked\n"
    store = None
    try:
        state_id = state_identity(config.state_dir)
        store = RunStore.open(config.store_url)
        worktree = Worktree.ensure(config.repo_path, config.state_dir, "fix-greet", "HEAD")
        run_id = store.begin_run(config_path=str(config.source), pid=live.pid, host=socket.gethostname(), state_id=state_id) if begun else None
        (config.state_dir / "overnight.lock").unlink()
        yield live.pid, store, worktree, run_id, f"{socket.gethostname()}:{live.pid}:abcd1234:{state_id}"
    finally:
        if store is not None:
            store.close()
        live.kill()
        live.wait()
        live.stdout.close()


def _stale_lock(lock: Path) -> None:
    """`lock` as a git killed an hour ago left it."""
    lock.write_text("")
    os.utime(lock, (time.time() - 3600,) * 2)


class TestRecoveryOfStoredState:
    """Recovery from states a killed night can leave, built with the real store and worktrees."""

    def _running(self, config: Any, task: str, pid: int) -> tuple[RunStore, Worktree, int, int, str]:
        store = RunStore.open(config.store_url)
        worktree = Worktree.ensure(config.repo_path, config.state_dir, task, "HEAD")
        run_id = store.begin_run(config_path=str(config.source), pid=pid, host=socket.gethostname())
        task_run = store.begin_task(run_id, name=task, branch=worktree.branch)
        checkpoint = worktree.checkpoint()
        iteration = store.begin_iteration(task_run, number=1, checkpoint=checkpoint, pid=pid)
        return store, worktree, run_id, iteration, checkpoint

    def test_a_live_night_whose_lock_file_was_removed_is_left_alone(self, tmp_path: Path, repo: Path) -> None:
        """`overnight.lock` deleted under a live night (a cleaner of "stale" locks): the next run gets a
        fresh lock, but recovering would stop that night's commands, roll its worktree back and free its
        leases. It is refused, exit 75's LockHeld naming the live pid, and nothing is touched."""
        config = _config(tmp_path, repo)
        with _live_night_without_its_lock_file(config) as (pid, store, worktree, run_id, owner):
            task_run = store.begin_task(run_id, name="fix-greet", branch=worktree.branch)
            store.begin_iteration(task_run, number=1, checkpoint=worktree.checkpoint(), pid=pid)
            assert store.acquire_lease("fix-greet", owner, ttl_s=600)
            (worktree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")  # its agent's edit
            in_flight = config.state_dir / ".notes.md.4242.tmp"  # its notes.md entry being written
            in_flight.write_text("## half an entry")
            with pytest.raises(LockHeld) as caught:
                recover(config)
            assert in_flight.exists()
            message = str(caught.value)
            assert f"pid {pid} on {socket.gethostname()}" in message and "lock file was removed" in message
            assert "\n" not in message
            assert [lease.owner for lease in store.leases()] == [owner]
            assert [i.task_name for i in store.running_iterations()] == ["fix-greet"]
            assert [r.id for r in store.running_runs()] == [run_id]
            assert "hello" in (worktree.path / "greet.py").read_text()
        settled, _ = recover(config)  # once it has ended, its run is this state dir's dead night
        assert [view.outcome for view in settled] == ["interrupted"]

    def test_a_live_night_that_holds_no_lease_yet_is_left_alone(self, tmp_path: Path, repo: Path) -> None:
        """The same night met before its first task took a lease (just begun, or writing its report
        after the last): known by its run, still running, of a live process begun before it. Recovery
        closed it as crashed."""
        config = _config(tmp_path, repo)
        with _live_night_without_its_lock_file(config) as (pid, store, _, run_id, _):
            with pytest.raises(LockHeld, match=f"pid {pid} on .*, run {run_id}\\) though .*lock file was removed"):
                recover(config)
            assert [r.id for r in store.running_runs()] == [run_id]
        recover(config)  # once it has ended, its run is this state dir's dead night
        reopened = RunStore.open(config.store_url)
        try:
            assert reopened.running_runs() == [] and reopened.run(run_id).status == "crashed"
        finally:
            reopened.close()

    def test_a_dead_nights_pid_now_another_process_begun_as_soon_is_no_live_night(self, tmp_path: Path, repo: Path, sleeper: subprocess.Popen) -> None:
        """A night killed in its first seconds, its pid at once another process's (a container restarted
        under the same host name): alive, and begun as early as the run, but without the state dir's lock
        open. Its run is settled, not taken for a live night's (exit 75 until that process ends)."""
        config = _config(tmp_path, repo)
        store = RunStore.open(config.store_url)
        try:
            run_id = store.begin_run(config_path=str(config.source), pid=sleeper.pid, host=socket.gethostname(), state_id=state_identity(config.state_dir))
        finally:
            store.close()
        recover(config)
        reopened = RunStore.open(config.store_url)
        try:
            assert reopened.run(run_id).status == "crashed"
        finally:
            reopened.close()

    def test_a_live_night_met_as_it_begins_is_still_left_alone(self, tmp_path: Path, repo: Path) -> None:
        """The same night met while it began: neither its run nor a lease at recovery's first look,
        both recorded while recovery reads the running iterations (SQLAlchemy's after_cursor_execute on
        recovery's store). Asked once, recovery went on: it closed the live run as crashed and rolled
        back the worktree its first task had begun in."""
        config = _config(tmp_path, repo)
        with _live_night_without_its_lock_file(config, begun=False) as (pid, night, worktree, _, owner):
            taken = threading.Event()
            run_id = None

            def next_task_begins(connection: Any, cursor: Any, statement: str, *_: Any) -> None:
                nonlocal run_id
                if "from iterations" in statement.lower() and not taken.is_set():
                    taken.set()
                    run_id = night.begin_run(
                        config_path=str(config.source), pid=pid, host=socket.gethostname(), state_id=state_identity(config.state_dir)
                    )
                    assert night.acquire_lease("fix-greet", owner, ttl_s=600)
                    task_run = night.begin_task(run_id, name="fix-greet", branch=worktree.branch)
                    night.begin_iteration(task_run, number=1, checkpoint=worktree.checkpoint(), pid=pid)
                    (worktree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")

            with StateLock(config.state_dir), structlog.testing.capture_logs():
                recovering = RunStore.open(config.store_url)
                sqlalchemy.event.listen(recovering._engine, "after_cursor_execute", next_task_begins)
                try:
                    with pytest.raises(LockHeld, match="lock file was removed"):
                        recover_interrupted(recovering, config, structlog.get_logger())
                finally:
                    recovering.close()
            assert taken.is_set()
            assert [r.id for r in night.running_runs()] == [run_id]
            assert [i.task_name for i in night.running_iterations()] == ["fix-greet"]
            assert "hello" in (worktree.path / "greet.py").read_text()

    def test_commit_made_before_the_death_is_kept(self, tmp_path: Path, repo: Path) -> None:
        """Killed after committing but before recording it: the commit stays and the iteration is `committed`."""
        config = _config(tmp_path, repo)
        store, worktree, run_id, _, checkpoint = self._running(config, "fix-greet", dead_pid())
        (worktree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")
        commit = worktree.commit("overnight: fix-greet iteration 1\n\nfixed")
        store.close()
        [settled], logs = recover(config)
        assert settled.outcome == "committed" and settled.commit == commit != checkpoint
        assert git(repo, "rev-parse", "overnight/fix-greet") == commit
        reopened = RunStore.open(config.store_url)
        run = reopened.run(run_id)
        reopened.close()
        assert run.status == "crashed" and run.tasks[0].outcome == "succeeded" and run.tasks[0].commit == commit
        [recovered] = [e for e in logs if e["event"] == "iteration_recovered"]
        assert (recovered["outcome"], recovered["checkpoint"]) == ("committed", checkpoint[:12])
        # Each of its fields is one reference.md names for it (it said `reason`, which only note_recovered has).
        reference = (REPO_ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
        [documented] = [line for line in reference.split("\n- ") if line.startswith("`iteration_recovered` (")]
        ids = {"event", "log_level", "run_id", "task", "task_run_id", "iteration", "iteration_id"}
        assert [field for field in recovered if field not in ids and f"`{field}`" not in documented] == []

    def test_a_commit_dated_past_what_the_dead_iteration_could_write_ends_it_no_later_than_that(self, tmp_path: Path, repo: Path) -> None:
        """The dead iteration was last seen six hours ago but its commit is dated now (a person's amend, a clock
        set right): its end is capped at the latest it could have written, not dated to the recovery."""
        config = _config(tmp_path, repo)
        store, worktree, run_id, iteration, _ = self._running(config, "fix-greet", dead_pid())
        (worktree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")
        commit = worktree.commit("overnight: fix-greet iteration 1\n\nfixed")
        store.close()
        seen = datetime.fromtimestamp(time.time() - 6 * 3600, timezone.utc)
        self._seen_last(config, iteration, seen)
        [settled], _ = recover(config)
        assert (settled.outcome, settled.commit) == ("committed", commit)
        reopened = RunStore.open(config.store_url)
        run = reopened.run(run_id)
        reopened.close()
        [ended] = [it.finished_at for it in run.tasks[0].iterations]
        could_write_by = seen + timedelta(seconds=config.night.check_timeout_s + config.model.request_timeout_s + 60)
        assert seen <= ended <= could_write_by
        assert settled.finished_at == ended

    def test_a_commit_a_person_amended_since_the_death_is_dated_to_when_the_iteration_made_it(self, tmp_path: Path, repo: Path) -> None:
        """The iteration committed a minute after its last heartbeat and died; in the morning a person amended the
        commit (a typo in the code), which dates its committer now: recovery dates the iteration's end to the commit's
        making, which the amend kept as its author date, not to the latest it could have written."""
        config = _config(tmp_path, repo)
        store, worktree, _, iteration, _ = self._running(config, "fix-greet", dead_pid())
        store.close()
        seen = datetime.fromtimestamp(int(time.time()) - 6 * 3600, timezone.utc)
        self._seen_last(config, iteration, seen)
        made = seen + timedelta(minutes=1)
        (worktree.path / "greet.py").write_text("def greet():\n    return 'helo!'\n")
        then = {"GIT_AUTHOR_DATE": made.isoformat(), "GIT_COMMITTER_DATE": made.isoformat(), **GIT_IDENTITY}
        subprocess.run(  # the iteration's commit as Worktree.commit makes it, made then
            ["git", "commit", "--quiet", "-a", "-m", "overnight: fix-greet iteration 1\n\nfixed"],
            cwd=worktree.path, env={**os.environ, **then}, check=True,
        )
        (worktree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")
        git(worktree.path, "commit", "--quiet", "--amend", "--no-edit", "-a")  # the person's fix, committed now
        amended = git(worktree.path, "rev-parse", "HEAD")
        [settled], _ = recover(config)
        assert (settled.outcome, settled.commit) == ("committed", amended)
        assert settled.finished_at == made

    def test_commit_made_on_the_agents_own_commit_before_the_death_is_kept(self, tmp_path: Path, repo: Path) -> None:
        """The agent committed part of the work itself, the iteration's commit followed (it keeps the
        agent's commits), then the kill: recovery keeps both, as it keeps a commit right on the checkpoint."""
        config = _config(tmp_path, repo)
        store, worktree, _, _, checkpoint = self._running(config, "fix-greet", dead_pid())
        (worktree.path / "part.txt").write_text("part one\n")
        git(worktree.path, "add", "part.txt")
        git(worktree.path, "commit", "-qm", "part one")
        (worktree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")
        commit = worktree.commit("overnight: fix-greet iteration 1\n\nfixed", onto=checkpoint)
        store.close()
        [settled], _ = recover(config)
        assert settled.outcome == "committed" and settled.commit == commit
        assert git(repo, "rev-parse", "overnight/fix-greet") == commit
        assert git(repo, "log", "--format=%s", "overnight/fix-greet").splitlines()[:2] == ["overnight: fix-greet iteration 1", "part one"]

    def _seen_last(self, config: Any, iteration: int, when: datetime) -> None:
        """The dead iteration's last heartbeat (the store writes its own clock's now)."""
        from sqlalchemy import update

        from runs.models import Iteration

        store = RunStore.open(config.store_url)
        try:
            with store._engine.begin() as connection:
                connection.execute(update(Iteration).where(Iteration.id == iteration).values(heartbeat_at=when, started_at=when))
        finally:
            store.close()

    def test_what_a_person_did_in_the_worktree_after_the_death_is_kept(self, tmp_path: Path, repo: Path) -> None:
        """The night died at 03:00; in the morning a person committed in the task's worktree and left a
        file of notes there. Recovery rolled the worktree back to the checkpoint and reset the branch:
        both gone (the person's commit on no branch). Now the commit stays on the branch (the next night
        builds on it, as on a reviewed branch) and the file is kept on an `overnight-kept/` branch."""
        config = _config(tmp_path, repo)
        store, worktree, _, iteration, checkpoint = self._running(config, "fix-greet", dead_pid())
        store.close()
        night = time.time() - 6 * 3600
        self._seen_last(config, iteration, datetime.fromtimestamp(night, timezone.utc))
        (worktree.path / "greet.py").write_text("half done by the agent\n")
        os.utime(worktree.path / "greet.py", (night, night))
        (worktree.path / "review.txt").write_text("the person's review\n")
        git(worktree.path, "add", "review.txt")
        git(worktree.path, "commit", "-qm", "the person's commit")
        person = git(worktree.path, "rev-parse", "HEAD")
        (worktree.path / "NOTES-person.md").write_text("what I found\n")
        [settled], logs = recover(config)
        assert settled.outcome == "interrupted" and checkpoint != person
        assert git(repo, "rev-parse", "overnight/fix-greet") == person and git(worktree.path, "status", "--porcelain") == ""
        [kept] = git(repo, "branch", "--list", "overnight-kept/fix-greet/*", "--format=%(refname:short)").splitlines()
        assert git(repo, "show", f"{kept}:NOTES-person.md") == "what I found"
        assert {e["event"] for e in logs} >= {"worktree_commits_left", "worktree_changes_kept"}

    def test_a_file_a_person_moved_into_the_worktree_after_the_death_is_kept(self, tmp_path: Path, repo: Path) -> None:
        """A file a person wrote before the night and moved into the worktree after its death (a move keeps its
        time of writing) is theirs: kept on an `overnight-kept/` branch, not deleted with the rollback."""
        config = _config(tmp_path, repo)
        store, worktree, _, iteration, _ = self._running(config, "fix-greet", dead_pid())
        store.close()
        night = time.time() - 6 * 3600
        self._seen_last(config, iteration, datetime.fromtimestamp(night, timezone.utc))
        written = tmp_path / "NOTES-person.md"
        written.write_text("what I wrote the evening before\n")
        os.utime(written, (night - 3600, night - 3600))
        written.rename(worktree.path / "NOTES-person.md")
        [settled], logs = recover(config)
        [kept] = git(repo, "branch", "--list", "overnight-kept/fix-greet/*", "--format=%(refname:short)").splitlines()
        assert git(repo, "show", f"{kept}:NOTES-person.md") == "what I wrote the evening before"
        assert settled.outcome == "interrupted" and "worktree_changes_kept" in [e["event"] for e in logs]

    def test_a_passed_value_the_killed_iterations_check_wrote_stays_off_the_kept_branch(
        self, tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The night died after its check (given pass_env) wrote the password into .env.test; a person then left notes
        in the worktree: their notes are kept on an `overnight-kept/` branch, the file with the password is not."""
        password = "Db-Pass-0123456789xyz"
        monkeypatch.setenv("DB_PASSWORD", password)
        task = {"name": "fix-greet", "prompt": "p", "check": "python check_greet.py", "pass_env": ["DB_PASSWORD"]}
        config = load_config(write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, tasks=[task]))
        store, worktree, _, iteration, _ = self._running(config, "fix-greet", dead_pid())
        store.close()
        night = time.time() - 6 * 3600
        self._seen_last(config, iteration, datetime.fromtimestamp(night, timezone.utc))
        (worktree.path / ".env.test").write_text(f"DB_PASSWORD={password}\n")
        os.utime(worktree.path / ".env.test", (night, night))
        (worktree.path / "NOTES-person.md").write_text("what I found\n")
        [settled], logs = recover(config)
        [kept] = git(repo, "branch", "--list", "overnight-kept/fix-greet/*", "--format=%(refname:short)").splitlines()
        assert git(repo, "diff", "--name-status", f"{kept}^", kept).splitlines() == ["A\tNOTES-person.md"]
        assert password not in git(repo, "log", "-p", "--all")
        assert [(e["task"], e["paths"], e["names"]) for e in logs if e["event"] == "secret_kept_out_of_commit"] == [
            ("fix-greet", [".env.test"], ["DB_PASSWORD"])
        ]
        assert settled.outcome == "interrupted" and git(worktree.path, "status", "--porcelain", "--ignored") == ""

    def test_a_passed_value_the_agent_committed_before_the_death_stays_off_the_kept_branch(
        self, tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The agent committed the .env its check wrote the password into, the night died, a person left notes in the
        worktree: the kept branch has their notes, and neither the agent's commit below them nor the password."""
        password = "Db-Pass-0123456789xyz"
        monkeypatch.setenv("DB_PASSWORD", password)
        task = {"name": "fix-greet", "prompt": "p", "check": "python check_greet.py", "pass_env": ["DB_PASSWORD"]}
        config = load_config(write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, tasks=[task]))
        store, worktree, _, iteration, checkpoint = self._running(config, "fix-greet", dead_pid())
        store.close()
        night = time.time() - 6 * 3600
        self._seen_last(config, iteration, datetime.fromtimestamp(night, timezone.utc))
        (worktree.path / ".env.test").write_text(f"DB_PASSWORD={password}\n")
        os.utime(worktree.path / ".env.test", (night, night))
        at_night = {**os.environ, "GIT_COMMITTER_DATE": f"@{int(night)} +0000", "GIT_AUTHOR_DATE": f"@{int(night)} +0000"}
        subprocess.run(["git", "add", ".env.test"], cwd=worktree.path, check=True)
        subprocess.run(["git", "commit", "-qm", "wip by the agent"], cwd=worktree.path, check=True, env=at_night)
        (worktree.path / "NOTES-person.md").write_text("what I found\n")
        [settled], logs = recover(config)
        [kept] = git(repo, "branch", "--list", "overnight-kept/fix-greet/*", "--format=%(refname:short)").splitlines()
        assert git(repo, "rev-parse", f"{kept}^") == checkpoint
        assert git(repo, "diff", "--name-status", f"{kept}^", kept).splitlines() == ["A\tNOTES-person.md"]
        assert password not in git(repo, "log", "-p", "--all")
        assert settled.outcome == "interrupted" and git(repo, "rev-parse", "overnight/fix-greet") == checkpoint

    def test_a_checkpoint_this_clone_lacks_keeps_a_persons_changes_on_head_as_before(
        self, tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The dead iteration's checkpoint is no commit here (another clone's): with pass_env, the person's file is still
        kept, on HEAD, and the recovery goes on; looking for the agent's commits above it does not end it (exit 4)."""
        from sqlalchemy import update

        from runs.models import Iteration

        monkeypatch.setenv("DB_PASSWORD", "Db-Pass-0123456789xyz")
        task = {"name": "fix-greet", "prompt": "p", "check": "python check_greet.py", "pass_env": ["DB_PASSWORD"]}
        config = load_config(write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, tasks=[task]))
        store, worktree, _, iteration, checkpoint = self._running(config, "fix-greet", dead_pid())
        with store._engine.begin() as connection:
            connection.execute(update(Iteration).where(Iteration.id == iteration).values(checkpoint="f" * 40))
        store.close()
        self._seen_last(config, iteration, datetime.fromtimestamp(time.time() - 6 * 3600, timezone.utc))
        (worktree.path / "NOTES-person.md").write_text("what I found\n")
        [settled], _ = recover(config)
        [kept] = git(repo, "branch", "--list", "overnight-kept/fix-greet/*", "--format=%(refname:short)").splitlines()
        assert git(repo, "rev-parse", f"{kept}^") == checkpoint
        assert git(repo, "show", f"{kept}:NOTES-person.md") == "what I found"
        assert settled.outcome == "interrupted"

    def test_the_agents_own_commit_before_the_death_is_rolled_back_and_kept_nowhere(self, tmp_path: Path, repo: Path) -> None:
        """The agent commits on the task branch itself; a kill after that is its iteration's, not a person's work."""
        config = _config(tmp_path, repo)
        store, worktree, _, _, checkpoint = self._running(config, "fix-greet", dead_pid())
        store.close()
        (worktree.path / "greet.py").write_text("half done by the agent\n")
        git(worktree.path, "commit", "-qam", "wip by the agent")
        [settled], logs = recover(config)
        assert settled.outcome == "interrupted" and git(repo, "rev-parse", "overnight/fix-greet") == checkpoint
        assert git(repo, "branch", "--list", "overnight-kept/*") == ""
        assert "worktree_commits_left" not in [e["event"] for e in logs]

    def test_a_persons_commit_on_the_iterations_own_keeps_both(self, tmp_path: Path, repo: Path) -> None:
        """The iteration committed, the night died before recording it, a person committed on top in the
        morning: the iteration is `committed` (its commit found below theirs), the branch keeps both."""
        config = _config(tmp_path, repo)
        store, worktree, _, iteration, checkpoint = self._running(config, "fix-greet", dead_pid())
        store.close()
        self._seen_last(config, iteration, datetime.fromtimestamp(time.time() - 6 * 3600, timezone.utc))
        (worktree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")
        commit = worktree.commit("overnight: fix-greet iteration 1\n\nfixed", onto=checkpoint)
        (worktree.path / "review.txt").write_text("reviewed\n")
        git(worktree.path, "add", "review.txt")
        git(worktree.path, "commit", "-qm", "the person's commit")
        person = git(worktree.path, "rev-parse", "HEAD")
        [settled], _ = recover(config)
        assert settled.outcome == "committed" and settled.commit == commit
        assert git(repo, "rev-parse", "overnight/fix-greet") == person
        assert git(repo, "rev-parse", "overnight/fix-greet^") == commit

    def test_the_agents_own_half_done_edits_are_not_kept(self, tmp_path: Path, repo: Path) -> None:
        """Only files written after the dead iteration could last have written are a person's: the agent's
        edits of the killed iteration are rolled back and kept nowhere, as before."""
        config = _config(tmp_path, repo)
        store, worktree, _, iteration, checkpoint = self._running(config, "fix-greet", dead_pid())
        store.close()
        (worktree.path / "greet.py").write_text("half done by the agent\n")
        (worktree.path / "scratch.txt").write_text("the agent's\n")
        [settled], _ = recover(config)
        assert settled.outcome == "interrupted" and git(worktree.path, "status", "--porcelain") == ""
        assert git(repo, "branch", "--list", "overnight-kept/*") == ""

    def test_a_branch_the_person_checked_out_in_their_checkout_is_left_to_them(self, tmp_path: Path, repo: Path) -> None:
        """After the death the person detached the task's worktree (git asks that) to check its branch out
        in their own checkout, and committed there. Recovery put the worktree back on the branch and reset
        it to the checkpoint, under the person's checkout: their commit off every branch."""
        config = _config(tmp_path, repo)
        store, worktree, _, _, checkpoint = self._running(config, "fix-greet", dead_pid())
        store.close()
        (worktree.path / "greet.py").write_text("half done by the agent\n")
        git(worktree.path, "checkout", "-q", "--detach")
        git(repo, "checkout", "-q", "overnight/fix-greet")
        (repo / "review.txt").write_text("reviewed\n")
        git(repo, "add", "review.txt")
        git(repo, "commit", "-qm", "the person's commit")
        person = git(repo, "rev-parse", "HEAD")
        [settled], logs = recover(config)
        assert settled.outcome == "interrupted"
        assert git(repo, "rev-parse", "overnight/fix-greet") == person and git(repo, "status", "--porcelain") == ""
        assert [e["event"] for e in logs if e["event"] == "worktree_not_rolled_back"] == ["worktree_not_rolled_back"]

    def test_a_commit_of_another_iteration_on_top_is_not_taken_for_this_ones(self, tmp_path: Path, repo: Path) -> None:
        config = _config(tmp_path, repo)
        store, worktree, _, _, checkpoint = self._running(config, "fix-greet", dead_pid())
        (worktree.path / "greet.py").write_text("def greet():\n    return 'hello'\n")
        worktree.commit("overnight: fix-greet iteration 7\n\nnot this one", onto=checkpoint)
        store.close()
        [settled], _ = recover(config)
        assert settled.outcome == "interrupted"
        assert git(repo, "rev-parse", "overnight/fix-greet") == checkpoint

    @pytest.mark.parametrize("lease_alive", [False, True])
    def test_this_state_dirs_night_under_another_host_name_is_judged_by_its_leases(self, tmp_path: Path, repo: Path, lease_alive: bool) -> None:
        """A container gets a new host name each night while its state dir stays on a volume: the dead
        night (its lease expired) is recovered. One whose lease is still renewed, as a copy of the
        state dir on another machine sharing the store would keep it, is left alone."""
        from orchestrator.lock import state_identity

        config = _config(tmp_path, repo)
        store = RunStore.open(config.store_url)
        worktree = Worktree.ensure(config.repo_path, config.state_dir, "fix-greet", "HEAD")
        run_id = store.begin_run(config_path=str(config.source), pid=4242, host="runner-monday", state_id=state_identity(config.state_dir))
        task_run = store.begin_task(run_id, name="fix-greet", branch=worktree.branch)
        checkpoint = worktree.checkpoint()
        store.begin_iteration(task_run, number=1, checkpoint=checkpoint, pid=4242)
        assert store.acquire_lease("fix-greet", f"runner-monday:4242:abcd1234:{state_identity(config.state_dir)}", ttl_s=60 if lease_alive else -1)
        (worktree.path / "greet.py").write_text("half done\n")
        git(worktree.path, "commit", "-qam", "wip by agent")
        (worktree.path / "check_greet.py").write_text("more, not committed\n")
        store.close()
        settled, _ = recover(config)
        reopened = RunStore.open(config.store_url)
        run = reopened.run(run_id)
        reopened.close()
        if lease_alive:
            assert settled == [] and run.status == "running"
            assert git(repo, "log", "-1", "--format=%s", "overnight/fix-greet") == "wip by agent"
            # Perhaps still at work: its worktree is neither cleaned nor taken for a person's changes.
            assert git(worktree.path, "status", "--porcelain") == "M check_greet.py"
            assert git(repo, "branch", "--list", "overnight-kept/*") == ""
        else:
            assert [s.outcome for s in settled] == ["interrupted"] and run.status == "crashed"
            assert git(repo, "rev-parse", "overnight/fix-greet") == checkpoint
            assert git(worktree.path, "status", "--porcelain") == ""

    def test_changes_in_an_idle_worktree_are_kept_on_a_branch_before_it_is_cleaned(self, tmp_path: Path, repo: Path) -> None:
        """A person's review edits in a worktree no iteration runs in (git lets the task branch be checked
        out only there) survive the next night's cleaning, on a branch of their own; the worktree's own
        index and branch are untouched, and ignored debris is not kept."""
        config = _config(tmp_path, repo)
        worktree = Worktree.ensure(config.repo_path, config.state_dir, "fix-greet", "HEAD")
        before = worktree.checkpoint()
        (worktree.path / "greet.py").write_text("def greet():\n    return 'hello'  # reviewed\n")
        (worktree.path / "REVIEW.md").write_text("looks fine\n")
        (worktree.path / "check_greet.py").unlink()
        (worktree.path / "junk.pyc").write_text("ignored")
        _, logs = recover(config)
        [kept] = git(repo, "branch", "--list", "overnight-kept/fix-greet/*", "--format=%(refname:short)").splitlines()
        assert git(repo, "rev-parse", f"{kept}^") == before
        assert sorted(git(repo, "diff", "--name-status", f"{kept}^", kept).splitlines()) == ["A\tREVIEW.md", "D\tcheck_greet.py", "M\tgreet.py"]
        assert "# reviewed" in git(repo, "show", f"{kept}:greet.py")
        assert git(worktree.path, "status", "--porcelain", "--ignored") == ""
        assert git(repo, "rev-parse", "overnight/fix-greet") == before
        assert [(e["event"], e["branch"]) for e in logs if e["event"] == "worktree_changes_kept"] == [("worktree_changes_kept", kept)]

    @pytest.mark.parametrize("index", [b"", b"garbage"], ids=["emptied", "garbled"])
    def test_a_worktree_git_cannot_read_is_set_aside_whole(self, tmp_path: Path, repo: Path, index: bytes) -> None:
        """An index a power loss emptied: git status fails, so whether a person's edits are there is unknown.
        Recovery deleted the folder, their review notes with it (found by a review); it is moved aside whole,
        and the task's worktree is made anew."""
        config = _config(tmp_path, repo)
        worktree = Worktree.ensure(config.repo_path, config.state_dir, "fix-greet", "HEAD")
        (worktree.path / "review_notes.txt").write_text("precious\n")
        Path(git(worktree.path, "rev-parse", "--git-dir"), "index").write_bytes(index)
        # The user's own worktree on a disk not mounted tonight: forgotten by a repository-wide prune.
        git(repo, "worktree", "add", "-q", "--detach", str(tmp_path / "usb" / "mine"))
        (tmp_path / "usb").rename(tmp_path / "unmounted")
        _, logs = recover(config)
        assert f"worktree {tmp_path / 'usb' / 'mine'}" in git(repo, "worktree", "list", "--porcelain")
        [aside] = [e for e in logs if e["event"] == "worktree_set_aside"]
        kept = Path(aside["kept_at"])
        assert kept.parent == config.state_dir / "worktrees-set-aside" and kept.name.startswith("fix-greet-")
        assert (kept / "review_notes.txt").read_text() == "precious\n"
        assert "index" in aside["why"] and not worktree.path.exists()
        assert aside["on"] == git(repo, "rev-parse", "overnight/fix-greet")
        again = Worktree.ensure(config.repo_path, config.state_dir, "fix-greet", "HEAD")
        assert git(again.path, "status", "--porcelain") == ""
        # Plain files now: git run there finds no worktree, so it cannot move the new one's branch or index.
        assert not (kept / ".git").exists()

    def test_changes_in_a_worktree_moved_with_the_state_dir_are_kept_too(self, tmp_path: Path, repo: Path) -> None:
        """After `mv` of the state dir (`[state] dir` edited), recovery took the moved worktree for a stranger's
        folder and left the person's edit in it: the night's first iteration then committed it as the agent's."""
        config = _config(tmp_path, repo)
        worktree = Worktree.ensure(config.repo_path, tmp_path / "old-state", "fix-greet", "HEAD")
        (worktree.path / "REVIEW.md").write_text("looks fine\n")
        config.state_dir.mkdir(parents=True, exist_ok=True)
        shutil.move(tmp_path / "old-state" / "worktrees", config.worktrees_dir)
        recover(config)
        [kept] = git(repo, "branch", "--list", "overnight-kept/fix-greet/*", "--format=%(refname:short)").splitlines()
        assert git(repo, "diff", "--name-only", f"{kept}^", kept).splitlines() == ["REVIEW.md"]
        assert not (config.worktrees_dir / "fix-greet" / "REVIEW.md").exists()

    def test_changes_in_a_worktree_are_kept_when_the_repository_moved(self, tmp_path: Path, repo: Path) -> None:
        """After `mv` of the repository (`[repo] path` edited, the state dir beside it), recovery took the task's worktree,
        whose `.git` link named the old place, for a stranger's folder and left the person's edit in it: the night then
        linked it again and its first rollback deleted the edit, kept nowhere."""
        worktree = Worktree.ensure(repo, _config(tmp_path, repo).state_dir, "fix-greet", "HEAD")
        (worktree.path / "REVIEW.md").write_text("looks fine\n")
        moved = tmp_path / "moved"
        shutil.move(repo, moved)
        _, logs = recover(_config(tmp_path, moved))
        [kept] = git(moved, "branch", "--list", "overnight-kept/fix-greet/*", "--format=%(refname:short)").splitlines()
        assert git(moved, "diff", "--name-only", f"{kept}^", kept).splitlines() == ["REVIEW.md"]
        assert not (worktree.path / "REVIEW.md").exists()
        assert not [e for e in logs if e["event"] == "worktree_folder_kept"], logs

    def test_changes_are_kept_when_the_repository_moved_and_a_file_is_where_its_git_dir_was(self, tmp_path: Path, repo: Path) -> None:
        """The repository moved and a file, no git dir, is where the worktree's `.git` link points: recovery took that
        git dir for still there and left the folder as a stranger's, while the night took it for gone (no other
        repository's), linked the folder again and its first rollback deleted the person's edit, kept nowhere."""
        worktree = Worktree.ensure(repo, _config(tmp_path, repo).state_dir, "fix-greet", "HEAD")
        (worktree.path / "REVIEW.md").write_text("looks fine\n")
        named = Path((worktree.path / ".git").read_text().removeprefix("gitdir:").strip())
        moved = tmp_path / "moved"
        shutil.move(repo, moved)
        named.parent.mkdir(parents=True)
        named.write_text("not a git dir\n")
        _, logs = recover(_config(tmp_path, moved))
        [kept] = git(moved, "branch", "--list", "overnight-kept/fix-greet/*", "--format=%(refname:short)").splitlines()
        assert git(moved, "diff", "--name-only", f"{kept}^", kept).splitlines() == ["REVIEW.md"]
        assert not [e for e in logs if e["event"] == "worktree_folder_kept"], logs

    def test_a_dead_iterations_git_link_naming_a_name_too_long_is_relinked_and_rolled_back(self, repo: Path) -> None:
        """The agent wrote a `.git` link naming a path no file can have (a name past 255 bytes), then the night died:
        recovery's check for a `.git` folder stopped on OSError (a traceback, every night) where it said "no folder"."""
        config = load_config(write_config(repo / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo))
        store, worktree, _, _, checkpoint = self._running(config, "fix-greet", dead_pid())
        store.close()
        (worktree.path / "greet.py").write_text("half done by the agent\n")
        (worktree.path / ".git").write_text(f"gitdir: {repo / ('a' * 300)}\n")
        [settled], _ = recover(config)
        assert settled.outcome == "interrupted" and git(worktree.path, "rev-parse", "HEAD") == checkpoint
        assert git(worktree.path, "status", "--porcelain") == ""

    @pytest.mark.parametrize("link", [b"gitdir: /nonexistent\n", b"\x8f\x00garbage\xff", b"", None], ids=["gone", "bytes", "empty", "deleted"])
    def test_a_dead_iterations_broken_git_link_outside_the_checkout_is_relinked_from_the_configured_repository(
        self, tmp_path: Path, repo: Path, link: bytes | None
    ) -> None:
        """The agent wrote garbage into its `.git` link, then the night died, the state dir outside the checkout: no
        repository above the worktree nor named by the link registers it, and recovery failed every later night (exit
        4, "no repository registers it"); the configured repository does, so the link is put back and rolled back."""
        config = _config(tmp_path, repo)
        store, worktree, _, _, checkpoint = self._running(config, "fix-greet", dead_pid())
        store.close()
        (worktree.path / "greet.py").write_text("half done by the agent\n")
        if link is None:
            (worktree.path / ".git").unlink()
        else:
            (worktree.path / ".git").write_bytes(link)
        [settled], _ = recover(config)
        assert settled.outcome == "interrupted" and git(worktree.path, "rev-parse", "HEAD") == checkpoint
        assert git(worktree.path, "status", "--porcelain") == ""
        assert Path(git(worktree.path, "rev-parse", "--path-format=absolute", "--git-common-dir")) == (repo / ".git").resolve()

    def test_a_dead_iterations_broken_git_link_is_relinked_when_the_configured_repository_is_a_linked_worktree(
        self, tmp_path: Path, repo: Path
    ) -> None:
        """`[repo] path` a linked worktree of another repository (its git dir is not its common dir), the state dir
        outside both: the registration is in the main repository's common dir, where recovery finds it."""
        linked = tmp_path / "linked"
        git(repo, "worktree", "add", "-q", "-b", "mine", str(linked))
        config = _config(tmp_path, linked)
        store, worktree, _, _, checkpoint = self._running(config, "fix-greet", dead_pid())
        store.close()
        (worktree.path / "greet.py").write_text("half done by the agent\n")
        (worktree.path / ".git").write_text("gitdir: /nonexistent\n")
        [settled], _ = recover(config)
        assert settled.outcome == "interrupted" and git(worktree.path, "rev-parse", "HEAD") == checkpoint
        assert git(worktree.path, "status", "--porcelain") == ""
        assert Path(git(worktree.path, "rev-parse", "--path-format=absolute", "--git-common-dir")) == (repo / ".git").resolve()

    def test_a_dead_iterations_folder_now_another_repositorys_worktree_is_left_as_it_is(self, tmp_path: Path, repo: Path) -> None:
        """After the night died a person made the task's folder a worktree of another repository of theirs (`git worktree
        add`), and edited there: recovery rolled it back through that repository, which lacks the checkpoint, and removed
        the folder, their edits with it. It is left as it is, as the night leaves it (WorktreeFolderTaken)."""
        config = _config(tmp_path, repo)
        store, worktree, _, _, _ = self._running(config, "fix-greet", dead_pid())
        store.close()
        other = make_repo(tmp_path / "other", {"mine.txt": "theirs\n"})
        shutil.rmtree(worktree.path)
        git(other, "worktree", "add", "-q", "-b", "work", str(worktree.path))
        (worktree.path / "mine.txt").write_text("my edit\n")
        [settled], logs = recover(config)
        assert settled.outcome == "interrupted"
        assert [e["task"] for e in logs if e["event"] == "worktree_folder_kept"] == ["fix-greet"], logs
        assert (worktree.path / "mine.txt").read_text() == "my edit\n"
        assert Path(git(worktree.path, "rev-parse", "--path-format=absolute", "--git-common-dir")) == (other / ".git").resolve()

    def test_a_dead_iterations_link_the_agent_pointed_at_another_repositorys_registration_is_relinked(
        self, tmp_path: Path, repo: Path
    ) -> None:
        """The agent wrote into its `.git` link the git dir of another repository's worktree, which does not name the
        folder back: not that repository's worktree, so the link is put back from the configured repository's
        registration and the agent's edit rolled back (not left as "a worktree of another repository", the task
        skipped every night after)."""
        config = _config(tmp_path, repo)
        store, worktree, _, _, checkpoint = self._running(config, "fix-greet", dead_pid())
        store.close()
        other = make_repo(tmp_path / "other", {"mine.txt": "theirs\n"})
        git(other, "worktree", "add", "-q", "-b", "work", str(tmp_path / "elsewhere"))
        (worktree.path / "greet.py").write_text("half done by the agent\n")
        (worktree.path / ".git").write_text(f"gitdir: {other / '.git' / 'worktrees' / 'elsewhere'}\n")
        [settled], _ = recover(config)
        assert settled.outcome == "interrupted" and git(worktree.path, "status", "--porcelain") == ""
        assert Path(git(worktree.path, "rev-parse", "--path-format=absolute", "--git-common-dir")) == (repo / ".git").resolve()

    def test_a_dead_iterations_worktree_no_repository_registers_is_still_refused(self, tmp_path: Path, repo: Path) -> None:
        """A folder with a broken link that neither the configured repository nor any other registers (its registration
        pruned): recovery still stops with the one-line StateError, and leaves the folder as it is."""
        config = _config(tmp_path, repo)
        store, worktree, _, _, _ = self._running(config, "fix-greet", dead_pid())
        store.close()
        (worktree.path / "greet.py").write_text("half done by the agent\n")
        (worktree.path / ".git").write_text("gitdir: /nonexistent\n")
        shutil.rmtree(repo / ".git" / "worktrees")
        with pytest.raises(StateError, match="no repository registers it"):
            recover(config)
        assert (worktree.path / "greet.py").read_text() == "half done by the agent\n"

    def test_an_idle_worktrees_git_link_naming_a_name_too_long_is_relinked_and_its_edits_kept(self, tmp_path: Path, repo: Path) -> None:
        """A `.git` link naming a path no file can have: recovery's relinking stopped on OSError, every night; no git dir
        is there, as for one gone, so the folder is linked again and a person's edit kept before the clean."""
        config = _config(tmp_path, repo)
        worktree = Worktree.ensure(repo, config.state_dir, "fix-greet", "HEAD")
        (worktree.path / "REVIEW.md").write_text("looks fine\n")
        (worktree.path / ".git").write_text(f"gitdir: {tmp_path / ('a' * 300)}\n")
        recover(config)
        [kept] = git(repo, "branch", "--list", "overnight-kept/fix-greet/*", "--format=%(refname:short)").splitlines()
        assert git(repo, "diff", "--name-only", f"{kept}^", kept).splitlines() == ["REVIEW.md"]

    @pytest.mark.parametrize("link", [b"\x8f\x00garbage\xff", None], ids=["bytes", "deleted"])
    def test_a_tasks_folder_whose_git_link_was_overwritten_or_deleted_is_set_aside_whole(
        self, tmp_path: Path, repo: Path, link: bytes | None
    ) -> None:
        """A configured task's folder, its registration naming it, whose `.git` a person overwrote or deleted (or where they
        put their own files): relinked and cleaned, the files git ignores and a repository inside were deleted, kept on no
        branch; set aside whole, nothing is lost, and the night makes the worktree anew."""
        config = _config(tmp_path, repo)
        worktree = Worktree.ensure(repo, config.state_dir, "fix-greet", "HEAD")
        (repo / ".git" / "info" / "exclude").write_text("*.log\n")
        (worktree.path / "REVIEW.md").write_text("looks fine\n")
        (worktree.path / "run.log").write_text("my log\n")
        git(worktree.path, "init", "-q", "mine")
        (worktree.path / "mine" / "notes.txt").write_text("my notes\n")
        if link is None:
            (worktree.path / ".git").unlink()
        else:
            (worktree.path / ".git").write_bytes(link)
        _, logs = recover(config)
        [aside] = [Path(e["kept_at"]) for e in logs if e["event"] == "worktree_set_aside"]
        assert (aside / "REVIEW.md").read_text() == "looks fine\n" and (aside / "run.log").read_text() == "my log\n"
        assert (aside / "mine" / "notes.txt").read_text() == "my notes\n"
        assert not worktree.path.exists() and "fix-greet" not in git(repo, "worktree", "list")

    def test_commits_on_the_detached_head_of_a_tasks_folder_set_aside_are_kept_on_a_branch(self, tmp_path: Path, repo: Path) -> None:
        """The task's folder set aside for its lost `.git` link held a person's commit on a detached HEAD, which only
        its registration named: kept on an `overnight-kept/` branch before the registration goes."""
        config = _config(tmp_path, repo)
        worktree = Worktree.ensure(repo, config.state_dir, "fix-greet", "HEAD")
        git(worktree.path, "checkout", "-q", "--detach")
        (worktree.path / "REVIEW.md").write_text("reviewed\n")
        git(worktree.path, "add", "REVIEW.md")
        git(worktree.path, "commit", "-q", "-m", "my review")
        mine = git(worktree.path, "rev-parse", "HEAD")
        (worktree.path / ".git").unlink()
        _, logs = recover(config)
        [kept] = [e["branch"] for e in logs if e["event"] == "worktree_commits_kept"]
        assert git(repo, "rev-parse", kept) == mine

    def test_a_folder_of_no_configured_task_without_its_git_link_is_left_as_it_is(self, tmp_path: Path, repo: Path) -> None:
        """The `.git` link deleted in the worktree of a task no longer configured: no night works there, so recovery
        neither relinks nor cleans it (a person's folder, maybe, where a stale registration names it)."""
        config = _config(tmp_path, repo)
        worktree = Worktree.ensure(repo, config.state_dir, "gone-task", "HEAD")
        (worktree.path / "REVIEW.md").write_text("mine\n")
        (worktree.path / ".git").unlink()
        _, logs = recover(config)
        assert [e["task"] for e in logs if e["event"] == "worktree_folder_kept"] == ["gone-task"]
        assert not (worktree.path / ".git").exists() and (worktree.path / "REVIEW.md").read_text() == "mine\n"

    def test_a_persons_clone_in_a_folder_a_stale_registration_names_is_left_whole(self, tmp_path: Path, repo: Path) -> None:
        """A task's worktree deleted by hand (no `git worktree prune`: its registration stays), and a person's own clone
        made in that folder: recovery linked it to the stale registration, which replaced the clone's `.git` folder,
        its history and all, with a link."""
        config = _config(tmp_path, repo)
        worktree = Worktree.ensure(repo, config.state_dir, "old-task", "HEAD")
        shutil.rmtree(worktree.path)
        git(tmp_path, "clone", "-q", str(repo), str(worktree.path))
        (worktree.path / "mine.txt").write_text("my own work\n")
        recover(config)
        assert (worktree.path / ".git").is_dir()
        assert git(worktree.path, "status", "--porcelain") == "?? mine.txt"

    def test_a_persons_worktree_of_the_repository_copied_from_stays_with_it(self, tmp_path: Path, repo: Path) -> None:
        """`cp -r repo copy`, `[repo] path` now the copy: a person's own worktree in the state dir, of the original, is
        registered in both. Recovery linked it to the copy, so the person's next commits there went to the copy and the
        original's worktree list named a folder that was no longer its own."""
        config = _config(tmp_path, repo)
        mine = config.worktrees_dir / "mine"
        git(repo, "worktree", "add", "-q", "-b", "mine", str(mine))
        shutil.copytree(repo, tmp_path / "copy", symlinks=True)
        recover(_config(tmp_path, tmp_path / "copy"))
        assert Path(git(mine, "rev-parse", "--path-format=absolute", "--git-common-dir")) == (repo / ".git").resolve()

    def test_keep_paths_nested_repositories_and_odd_names_do_not_stop_the_night(self, tmp_path: Path, repo: Path) -> None:
        """`[repo] keep = ["/build"]` (the patterns `git clean -e` takes) stays out of the kept branch; an
        empty nested repository (`git init scratch`) is left out instead of failing every night; a name
        with glob characters is kept as it is named."""
        config = _config(tmp_path, repo)
        config = config.model_copy(update={"repo": config.repo.model_copy(update={"keep": ["/build"]})})
        worktree = Worktree.ensure(config.repo_path, config.state_dir, "fix-greet", "HEAD", config.repo.keep)
        (worktree.path / "build").mkdir()
        (worktree.path / "build" / "cache.bin").write_text("kept by rollback, not a change")
        (worktree.path / "a[1].txt").write_text("odd name\n")
        subprocess.run(["git", "init", "-q", str(worktree.path / "scratch")], check=True)
        recover(config)
        [kept] = git(repo, "branch", "--list", "overnight-kept/fix-greet/*", "--format=%(refname:short)").splitlines()
        assert git(repo, "diff", "--name-only", f"{kept}^", kept).splitlines() == ["a[1].txt"]
        assert (worktree.path / "build" / "cache.bin").exists() and not (worktree.path / "a[1].txt").exists()

    def test_a_first_checkout_cut_short_is_not_kept_as_changes(self, tmp_path: Path, repo: Path) -> None:
        """No index yet (killed during the worktree's first checkout): the missing files are nobody's deletions; recovery
        leaves the worktree to the night's checkout, which brings them back."""
        config = _config(tmp_path, repo)
        worktree = Worktree.ensure(config.repo_path, config.state_dir, "fix-greet", "HEAD")
        (worktree.path / "greet.py").unlink()
        admin = Path(git(worktree.path, "rev-parse", "--absolute-git-dir"))
        # Nor marked as the task's: a night marks it once its first checkout is done (marked, its index was lost since).
        for name in ("index", "overnight-task"):
            (admin / name).unlink()
        recover(config)
        assert git(repo, "branch", "--list", "overnight-kept/*") == ""
        worktree = Worktree.ensure(config.repo_path, config.state_dir, "fix-greet", "HEAD")
        assert (worktree.path / "greet.py").exists() and worktree.idle_state() == "clean"

    def test_an_idle_worktree_with_only_ignored_debris_is_cleaned_without_a_branch(self, tmp_path: Path, repo: Path) -> None:
        config = _config(tmp_path, repo)
        worktree = Worktree.ensure(config.repo_path, config.state_dir, "fix-greet", "HEAD")
        (worktree.path / "junk.pyc").write_text("ignored")
        recover(config)
        assert git(repo, "branch", "--list", "overnight-kept/*") == ""
        assert not (worktree.path / "junk.pyc").exists()

    def test_a_worktree_that_can_be_neither_cleaned_nor_removed_is_set_aside(self, tmp_path: Path, repo: Path) -> None:
        """Debris that may not be deleted (root's build output, here immutable): `git clean` failed, the folder
        was then deleted but for that file and logged removed, and the task's worktree could not be made
        there again ("already exists") on any later night. It is set aside whole, and made anew."""
        config = _config(tmp_path, repo)
        worktree = Worktree.ensure(config.repo_path, config.state_dir, "fix-greet", "HEAD")
        stuck = worktree.path / "__pycache__" / "stuck.pyc"
        stuck.parent.mkdir()
        stuck.write_text("build output")
        if subprocess.run(["chattr", "+i", str(stuck)], capture_output=True).returncode != 0:
            pytest.skip("needs chattr +i (root, on a file system that has the flag)")
        try:
            _, logs = recover(config)
            assert [e for e in logs if e["event"] == "worktree_removed"] == []
            [aside] = [e for e in logs if e["event"] == "worktree_set_aside"]
            assert aside["why"].startswith("StateError: cannot roll back") and aside["why"].endswith(", which could not be removed whole")
            assert (Path(aside["kept_at"]) / "__pycache__" / "stuck.pyc").exists()
            again = Worktree.ensure(config.repo_path, config.state_dir, "fix-greet", "HEAD")
            assert git(again.path, "status", "--porcelain", "--ignored") == ""
        finally:
            for found in config.state_dir.rglob("stuck.pyc"):
                subprocess.run(["chattr", "-i", str(found)], capture_output=True)

    def test_commit_the_agent_made_itself_is_rolled_back(self, tmp_path: Path, repo: Path) -> None:
        """A commit not made by overnight's commit step (e.g. the agent ran git commit) never survives recovery."""
        config = _config(tmp_path, repo)
        store, worktree, _, _, checkpoint = self._running(config, "fix-greet", dead_pid())
        (worktree.path / "greet.py").write_text("broken\n")
        git(worktree.path, "commit", "-qam", "agent did this")
        store.close()
        [settled], _ = recover(config)
        assert settled.outcome == "interrupted" and git(repo, "rev-parse", "overnight/fix-greet") == checkpoint

    def test_a_folder_named_like_a_half_written_notes_file_is_left_and_the_night_goes_on(self, tmp_path: Path, repo: Path, capsys: Any) -> None:
        """Recovery deletes `.notes.md.*.tmp`, a killed night's half-written notes.md: a folder so named
        was an IsADirectoryError traceback (exit 1) before any task. It is nobody's debris of ours:
        left as it is, and the night goes on (here to an unreachable model: exit 3)."""
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo)
        folder = tmp_path / "state" / ".notes.md.123.tmp"
        folder.mkdir(parents=True)
        (folder / "kept.txt").write_text("someone's\n")
        code = overnight("run", "--config", str(config))
        err = capsys.readouterr().err
        assert code == 3 and "Traceback" not in err, err
        assert (folder / "kept.txt").read_text() == "someone's\n"

    def test_live_process_is_left_alone_and_debris_is_cleared(self, tmp_path: Path, repo: Path, sleeper: subprocess.Popen) -> None:
        """An iteration of a live process is untouched; temp files and dead processes' leases are cleared."""
        config = _config(tmp_path, repo)
        store, _, run_id, iteration, _ = self._running(config, "fix-greet", sleeper.pid)
        dead = f"{socket.gethostname()}:{dead_pid()}:abcd"
        store.acquire_lease("second", dead, 600)
        store.close()
        (config.state_dir / ".notes.md.12345.tmp").write_text("## half an ent")
        settled, _ = recover(config)
        assert settled == []
        reopened = RunStore.open(config.store_url)
        try:
            assert [it.id for it in reopened.running_iterations()] == [iteration]
            assert reopened.run(run_id).status == "running" and reopened.leases() == []
        finally:
            reopened.close()
        assert not list(config.state_dir.glob(".notes.md.*.tmp"))

    def test_git_lock_left_by_a_killed_git_is_removed(self, tmp_path: Path, repo: Path) -> None:
        """A stale index.lock in the worktree's git dir would break every later git command; recovery removes it."""
        config = _config(tmp_path, repo)
        store, worktree, _, _, _ = self._running(config, "fix-greet", dead_pid())
        store.close()
        (worktree.path / "greet.py").write_text("half\n")
        gitdir = Path((worktree.path / ".git").read_text().split("gitdir:")[1].strip())
        (gitdir / "index.lock").write_text("")
        [settled], _ = recover(config)
        assert settled.outcome == "interrupted" and git(worktree.path, "status", "--porcelain", "--ignored") == ""

    def test_the_repositorys_ref_stack_lock_is_kept_while_an_iteration_may_be_at_work(self, tmp_path: Path, repo: Path, sleeper: subprocess.Popen) -> None:
        """The lock on the repository's reftable stack is every checkout's: while an iteration of a live process may
        be at work, its git may hold it, and it is left; once that iteration is dead, it is removed."""
        config = _config(tmp_path, repo)
        store, _, _, _, _ = self._running(config, "fix-greet", sleeper.pid)
        store.close()
        lock = repo / ".git" / "reftable" / "tables.list.lock"
        lock.parent.mkdir(exist_ok=True)
        _stale_lock(lock)
        assert recover(config)[0] == [] and lock.exists()
        sleeper.kill()
        sleeper.wait()
        [settled], logs = recover(config)
        assert settled.outcome == "interrupted" and not lock.exists()
        assert {"event": "ref_stack_lock_removed", "path": str(lock)}.items() <= next(e for e in logs if e.get("path") == str(lock)).items()

    def test_the_repositorys_ref_stack_lock_is_not_kept_for_another_machines_iteration(self, tmp_path: Path, repo: Path, sleeper: subprocess.Popen) -> None:
        """Another state dir's iteration keeps the repository's stack lock only while its process lives on this host: one
        of another machine sharing the store works in that machine's own clone."""
        config = _config(tmp_path, repo)
        store = RunStore.open(config.store_url)
        lock = repo / ".git" / "reftable" / "tables.list.lock"
        lock.parent.mkdir(exist_ok=True)
        for host in (socket.gethostname(), "another-machine"):
            run_id = store.begin_run(config_path="c.toml", pid=sleeper.pid, host=host, state_id="e" * 32)
            task_run = store.begin_task(run_id, name="fix-greet", branch="overnight/fix-greet")
            iteration = store.begin_iteration(task_run, number=1, checkpoint="c" * 40, pid=sleeper.pid)
            _stale_lock(lock)
            recover(config)
            assert lock.exists() == (host == socket.gethostname()), host
            store.finish_iteration(iteration, outcome="interrupted")
        store.close()

    def test_a_ref_stack_lock_a_git_may_hold_now_is_kept(self, tmp_path: Path, repo: Path) -> None:
        """No iteration of ours at work, yet the repository's stack lock made a moment ago is left: a person's commit in
        their checkout (or a night no store of ours shows) holds it, and would have its update undone."""
        config = _config(tmp_path, repo)
        lock = repo / ".git" / "reftable" / "tables.list.lock"
        lock.parent.mkdir(exist_ok=True)
        lock.write_text("")
        recover(config)
        assert lock.exists()
        _stale_lock(lock)
        recover(config)
        assert not lock.exists()

    def test_a_command_the_killed_night_left_running_is_stopped_before_the_rollback(self, tmp_path: Path, repo: Path) -> None:
        """A check runs in its own session: `kill -9` of overnight alone (the OOM killer) leaves it writing into the worktree."""
        from orchestrator.command_environment import COMMAND_MARK

        config = _config(tmp_path, repo)
        store, worktree, _, _, _ = self._running(config, "fix-greet", dead_pid())
        store.close()
        script = "while true; do date >> stamp.txt; sleep 0.05; done"
        orphan = subprocess.Popen(["bash", "-c", script], cwd=worktree.path, start_new_session=True,
                                  env={**os.environ, COMMAND_MARK: str(worktree.path)})
        elsewhere = subprocess.Popen(["sleep", "30"], start_new_session=True, env={**os.environ, COMMAND_MARK: str(tmp_path)})
        try:
            _wait_for(lambda: (worktree.path / "stamp.txt").exists(), 10, "the orphan to write")
            [settled], logs = recover(config)
            assert orphan.wait(timeout=5) == -signal.SIGKILL and elsewhere.poll() is None
            time.sleep(0.2)
            assert settled.outcome == "interrupted" and not (worktree.path / "stamp.txt").exists()
            assert [e["pid"] for e in logs if e["event"] == "orphan_command_stopped"] == [orphan.pid]
        finally:
            for process in (orphan, elsewhere):
                process.kill()
                process.wait()

    def test_only_what_a_killed_worktree_add_left_is_removed(self, tmp_path: Path, repo: Path) -> None:
        """An empty folder, or one holding only the .git link, is debris; a person's folder or clone there is kept whole."""
        config = _config(tmp_path, repo)
        Worktree.ensure(config.repo_path, config.state_dir, "fix-greet", "HEAD")
        root = config.worktrees_dir
        (root / "empty").mkdir()
        (root / "link-only").mkdir()
        (root / "link-only" / ".git").write_text(f"gitdir: {repo / '.git' / 'worktrees' / 'link-only'}\n")
        (root / "my-notes").mkdir()
        (root / "my-notes" / "ideas.txt").write_text("keep me\n")
        git(repo, "clone", "-q", str(repo), str(root / "a-clone"))
        (root / "a-clone" / "wip.txt").write_text("uncommitted\n")
        (root / "fix-greet" / "debris.txt").write_text("left by a death\n")
        _, logs = recover(config)
        assert sorted(p.name for p in root.iterdir()) == ["a-clone", "fix-greet", "my-notes"]
        assert (root / "my-notes" / "ideas.txt").read_text() == "keep me\n" and (root / "a-clone" / "wip.txt").exists()
        assert not (root / "fix-greet" / "debris.txt").exists()
        kept = sorted(e["task"] for e in logs if e["event"] == "worktree_folder_kept")
        assert kept == ["a-clone", "my-notes"]


class TestRecoveryKeepsPassedSecretsOffKeptBranches:
    """A night killed after a check given `pass_env` wrote a passed value into a file, and before the commit, left the
    file in the worktree: the next night's recovery keeps a person's changes on `overnight-kept/...` without it."""

    PASSWORD = "Db-Pass-0123456789xyz"

    @pytest.fixture(autouse=True)
    def password_in_environment(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("DB_PASSWORD", self.PASSWORD)

    def _config(self, tmp_path: Path, repo: Path, *tasks: dict[str, Any]) -> Any:
        path = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, tasks=list(tasks))
        return load_config(path)

    def _leave_what_the_check_wrote(self, worktree: Worktree) -> None:
        """What the killed night's check left (a .env, a cache named after the value), beside a person's review edit."""
        (worktree.path / ".env.test").write_text(f"DB_PASSWORD={self.PASSWORD}\n")
        (worktree.path / "cache").mkdir()
        (worktree.path / "cache" / f"{self.PASSWORD}.stamp").write_text("")
        (worktree.path / "REVIEW.md").write_text("looks fine\n")

    def _kept_branch(self, repo: Path, task: str) -> str:
        [kept] = git(repo, "branch", "--list", f"overnight-kept/{task}/*", "--format=%(refname:short)").splitlines()
        return kept

    def test_the_tasks_passed_values_stay_off_the_kept_branch(self, tmp_path: Path, repo: Path) -> None:
        """The person's edit is kept; the files holding the task's pass_env value (in content or path) are not, and the log names them with ***."""
        config = self._config(tmp_path, repo, {"name": "fix-greet", "prompt": "p", "check": "true", "pass_env": ["DB_PASSWORD"]})
        worktree = Worktree.ensure(config.repo_path, config.state_dir, "fix-greet", "HEAD")
        self._leave_what_the_check_wrote(worktree)
        _, logs = recover(config)
        kept = self._kept_branch(repo, "fix-greet")
        assert git(repo, "diff", "--name-status", f"{kept}^", kept).splitlines() == ["A\tREVIEW.md"]
        assert self.PASSWORD not in git(repo, "log", "-p", "--name-only", "--all")
        [out] = [e for e in logs if e["event"] == "secret_kept_out_of_commit"]
        assert (out["task"], out["paths"], out["names"]) == ("fix-greet", [".env.test", "cache/***.stamp"], ["DB_PASSWORD"])
        assert self.PASSWORD not in json.dumps(logs)
        assert git(worktree.path, "status", "--porcelain", "--ignored") == ""

    def test_a_file_moved_into_a_folder_named_after_the_value_stays_on_the_kept_branch(self, tmp_path: Path, repo: Path) -> None:
        """greet.py moved to `<value>/greet.py`: the new path stays off the kept branch and the old one on it, not removed."""
        config = self._config(tmp_path, repo, {"name": "fix-greet", "prompt": "p", "check": "true", "pass_env": ["DB_PASSWORD"]})
        worktree = Worktree.ensure(config.repo_path, config.state_dir, "fix-greet", "HEAD")
        (worktree.path / self.PASSWORD).mkdir()
        git(worktree.path, "mv", "greet.py", f"{self.PASSWORD}/greet.py")
        (worktree.path / "REVIEW.md").write_text("looks fine\n")
        _, logs = recover(config)
        kept = self._kept_branch(repo, "fix-greet")
        assert git(repo, "diff", "--name-status", f"{kept}^", kept).splitlines() == ["A\tREVIEW.md"]
        assert self.PASSWORD not in git(repo, "log", "-p", "--name-only", "--all")
        assert [e["paths"] for e in logs if e["event"] == "secret_kept_out_of_commit"] == [["***/greet.py"]]

    def test_a_task_gone_from_the_config_is_searched_for_every_configured_tasks_values(self, tmp_path: Path, repo: Path) -> None:
        """A worktree of a task no longer configured: its pass_env is unknown, so every configured task's values stay off its kept branch."""
        config = self._config(
            tmp_path, repo,
            {"name": "plain", "prompt": "p", "check": "true"},
            {"name": "db", "prompt": "p", "check": "true", "pass_env": ["DB_PASSWORD"]},
        )
        worktree = Worktree.ensure(config.repo_path, config.state_dir, "renamed-away", "HEAD")
        self._leave_what_the_check_wrote(worktree)
        _, logs = recover(config)
        kept = self._kept_branch(repo, "renamed-away")
        assert git(repo, "diff", "--name-status", f"{kept}^", kept).splitlines() == ["A\tREVIEW.md"]
        assert self.PASSWORD not in git(repo, "log", "-p", "--name-only", "--all")
        assert [(e["task"], e["names"]) for e in logs if e["event"] == "secret_kept_out_of_commit"] == [("renamed-away", ["DB_PASSWORD"])]

    def test_a_task_without_pass_env_keeps_everything_as_before(self, tmp_path: Path, repo: Path) -> None:
        """Nothing is looked for where the task's check gets no secret: a value equal to a secret variable's is a person's to keep."""
        config = self._config(
            tmp_path, repo,
            {"name": "fix-greet", "prompt": "p", "check": "true"},
            {"name": "db", "prompt": "p", "check": "true", "pass_env": ["DB_PASSWORD"]},
        )
        worktree = Worktree.ensure(config.repo_path, config.state_dir, "fix-greet", "HEAD")
        (worktree.path / "fixture.txt").write_text(f"{self.PASSWORD}\n")
        _, logs = recover(config)
        assert git(repo, "show", f"{self._kept_branch(repo, 'fix-greet')}:fixture.txt") == self.PASSWORD
        assert [e for e in logs if e["event"] == "secret_kept_out_of_commit"] == []

    def test_only_the_passed_values_file_left_keeps_no_branch(self, tmp_path: Path, repo: Path) -> None:
        """When what the check wrote is all there is, no kept branch is made and the worktree is cleaned."""
        config = self._config(tmp_path, repo, {"name": "fix-greet", "prompt": "p", "check": "true", "pass_env": ["DB_PASSWORD"]})
        worktree = Worktree.ensure(config.repo_path, config.state_dir, "fix-greet", "HEAD")
        (worktree.path / ".env.test").write_text(f"DB_PASSWORD={self.PASSWORD}\n")
        _, logs = recover(config)
        assert git(repo, "branch", "--list", "overnight-kept/*") == ""
        assert [e["event"] for e in logs if e.get("task") == "fix-greet"] == ["secret_kept_out_of_commit", "worktree_cleaned"]
        assert not (worktree.path / ".env.test").exists()


class TestStateDirFailingMidNight:
    """What cannot be written mid-night ends it in one line (exit 4); the store says how the iteration ended."""

    def _night(self, tmp_path: Path, repo: Path, server: Any, capsys: Any) -> tuple[int, str, Any]:
        config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, night={"max_iterations": 1})
        code = overnight("run", "--config", str(config))
        err = capsys.readouterr().err.strip().splitlines()
        store = RunStore.open(load_config(config).store_url)
        try:
            return code, err[-1], store.latest_run()
        finally:
            store.close()

    def test_a_transcript_that_cannot_be_written(self, tmp_path: Path, repo: Path, server: Any, capsys: Any) -> None:
        """Was a traceback (exit 1) with the iteration left `running`: now exit 4 before the iteration is recorded."""
        (tmp_path / "state" / "transcripts" / "task-run-1-fix-greet-1.jsonl").mkdir(parents=True)
        code, last, run = self._night(tmp_path, repo, server, capsys)
        assert code == 4 and last.startswith("overnight: error: cannot write transcript"), last
        assert run.status == "crashed" and [it for task in run.tasks for it in task.iterations] == []

    def test_a_disk_that_fills_while_the_transcript_is_written(self, tmp_path: Path, repo: Path, server: Any, capsys: Any) -> None:
        """/dev/full opens, then every write fails with ENOSPC: exit 4, worktree at its checkpoint, the iteration's end recorded."""
        (tmp_path / "state" / "transcripts").mkdir(parents=True)
        (tmp_path / "state" / "transcripts" / "task-run-1-fix-greet-1.jsonl").symlink_to("/dev/full")
        code, last, run = self._night(tmp_path, repo, server, capsys)
        assert code == 4 and last.startswith("overnight: error: cannot write transcript") and last.endswith("disk full"), last
        [iteration] = run.tasks[0].iterations
        assert (iteration.outcome, iteration.reason) == ("rolled_back", "iteration_error")
        assert git(tmp_path / "state" / "worktrees" / "fix-greet", "status", "--porcelain", "--ignored") == ""

    def test_a_notes_file_that_cannot_be_written(self, tmp_path: Path, repo: Path, server: Any, capsys: Any) -> None:
        """Was exit 4 with the iteration left `running`: the store now records its real end before the note fails."""
        (tmp_path / "state" / "notes.md.lock").mkdir(parents=True)  # readable notes, but no append can take the lock
        server.enqueue(call("submit", {"summary": "done"}))
        code, last, run = self._night(tmp_path, repo, server, capsys)
        assert code == 4 and "notes.md" in last, last
        [iteration] = run.tasks[0].iterations
        assert (iteration.outcome, iteration.reason) == ("rolled_back", "check_failed")
        # The night died under the task: `interrupted` (JUnit's error), not the check's failure (the task's own).
        assert (run.tasks[0].outcome, run.tasks[0].reason) == ("failed", "interrupted")
        # The state dir mended, the next night's recovery writes the entry this night owed, once.
        (tmp_path / "state" / "notes.md.lock").rmdir()
        config = load_config(tmp_path / "overnight.toml")
        _, logs = recover(config)
        [entry] = NotesBook(config.notes_path).entries()
        assert (entry.task, entry.iteration, entry.reason) == ("fix-greet", 1, "check_failed")
        assert [e["event"] for e in logs].count("note_recovered") == 1
        recover(config)
        assert len(NotesBook(config.notes_path).entries()) == 1


    def test_notes_unreadable_as_an_iteration_begins(self, tmp_path: Path, repo: Path, capsys: Any) -> None:
        """notes.md turned unreadable (a folder in its place) once the task's first request had left, before
        its iteration read the notes: that iteration was recorded first and stayed `running` in the ended
        (`crashed`) run, and the task queued behind it read `failed (interrupted)` though it never began.
        Now no iteration is recorded, and the other task is `cancelled`, reason `night_crashed`."""
        from orchestrator.fake_server import ScriptedServer

        notes = tmp_path / "state" / "notes.md"

        def respond(body: dict[str, Any]) -> Reply:
            if not notes.is_dir():
                notes.unlink(missing_ok=True)
                notes.mkdir(parents=True)
            return call("submit", {"summary": "done"})

        tasks = [{"name": "first", "prompt": "p", "check": "true"}, {"name": "second", "prompt": "p", "check": "true"}]
        with ScriptedServer(responder=respond) as server:
            config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=tasks)
            assert overnight("run", "--config", str(config)) == 4
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last.startswith("overnight: error: cannot read") and "notes.md" in last, last
        store = RunStore.open(load_config(config).store_url)
        try:
            run = store.latest_run()
        finally:
            store.close()
        assert (run.status, run.exit_code) == ("crashed", 4)
        account = [(task.name, task.outcome, task.reason, [it.outcome for it in task.iterations]) for task in run.tasks]
        assert account == [("first", "failed", "interrupted", []), ("second", "cancelled", "night_crashed", [])]


@pytest.fixture
def state_mount(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs for the state dir, which the test can make read-only; skipped where mounting is not allowed."""
    point = tmp_path / "state"
    point.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(point)], capture_output=True).returncode != 0:
        pytest.skip("needs permission to mount a tmpfs")
    yield point
    subprocess.run(["umount", "-l", str(point)], capture_output=True)


def test_the_morning_report_reads_a_state_dir_gone_read_only(tmp_path: Path, repo: Path, server: Any, state_mount: Path, capsys: Any) -> None:
    """errors=remount-ro at 03:00: the night's account is on disk, and `overnight report` still shows it."""
    from tests.test_night import FIX

    config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo)
    server.enqueue(*FIX)
    assert overnight("run", "--config", str(config)) == 0
    capsys.readouterr()
    subprocess.run(["mount", "-o", "remount,ro", str(state_mount)], check=True)
    assert overnight("report", "--config", str(config), "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["run"]["status"] == "finished" and report["tasks"][0]["outcome"] == "succeeded"


def test_the_morning_report_reads_an_older_versions_store_gone_read_only(tmp_path: Path, repo: Path, server: Any, state_mount: Path, capsys: Any) -> None:
    """A store an older version wrote (no `state_id` column yet) on a state dir gone read-only: the columns
    cannot be added there, and the report failed on "no such column" (an outside review); it reads a copy."""
    from tests.test_night import FIX

    config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo)
    server.enqueue(*FIX)
    assert overnight("run", "--config", str(config)) == 0
    db = sqlite3.connect(state_mount / "runs.db")
    db.execute("ALTER TABLE runs DROP COLUMN state_id")
    db.execute("ALTER TABLE iterations DROP COLUMN note_owed")
    db.commit()
    db.close()
    capsys.readouterr()
    subprocess.run(["mount", "-o", "remount,ro", str(state_mount)], check=True)
    assert overnight("report", "--config", str(config), "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["run"]["status"] == "finished" and report["tasks"][0]["outcome"] == "succeeded"


@pytest.mark.parametrize("older", [False, True], ids=["this version's store", "an older version's store"])
def test_a_store_whose_file_name_holds_a_percent_is_read_on_a_state_dir_gone_read_only(state_mount: Path, older: bool) -> None:
    """`[store] url = "sqlite:///runs%2541.db"` names the file runs%41.db; gone read-only, it is read as it is, or from
    a copy: neither URL made for them may decode the `%41` again (that file, runsA.db, does not exist)."""
    url = f"sqlite:///{state_mount / 'runs%2541.db'}"
    store = RunStore.open(url)
    run_id = store.begin_run(config_path="c.toml", pid=1, host="h", state_id="s" * 32)
    store.finish_run(run_id, status="finished", exit_code=0)
    store.close()
    if older:
        with contextlib.closing(sqlite3.connect(state_mount / "runs%41.db")) as db:
            db.execute("ALTER TABLE runs DROP COLUMN state_id")
            db.commit()
    subprocess.run(["mount", "-o", "remount,ro", str(state_mount)], check=True)
    reader = RunStore.open_for_reading(url)
    try:
        latest = reader.latest_run()
        assert (latest.id, latest.status) == (run_id, "finished")
    finally:
        reader.close()

def test_events_on_a_disk_that_fills_fail_whole_and_the_store_writes_again_once_it_has_room(state_mount: Path) -> None:
    """SQLite's event batches go through a connection of their own (runs/event_batches.py): a batch the full
    disk refuses is one StateError line at the next flush, and once there is room again the next batch
    is written (on a fresh connection: the refused one was given up)."""
    store = RunStore.open(f"sqlite:///{state_mount / 'runs.db'}")
    try:
        run_id = store.begin_run(config_path="c.toml", pid=1, host="h")
        task_id = store.begin_task(run_id, name="t", branch="b")
        iteration_id = store.begin_iteration(task_id, number=1, checkpoint="c", pid=1)
        store.record_tool_call(iteration_id, name="read_file", ok=True)
        store.flush()
        filler = state_mount / "filler"
        with contextlib.suppress(OSError), filler.open("wb") as out:
            while True:
                out.write(b"\0" * (256 << 10))
                out.flush()
        for n in range(200):  # more than the last pages' room
            store.record_tool_call(iteration_id, name="write_file", ok=True, message="x" * 2000, data={"n": n})
        with pytest.raises(StateError, match=r"^run store: recording events failed: database or disk is full$"):
            store.flush()
        filler.unlink()
        store.record_tool_call(iteration_id, name="list_dir", ok=True)
        store.flush()
        names = [name for (name,) in sqlite3.connect(state_mount / "runs.db").execute("SELECT name FROM events ORDER BY id")]
        assert names[0] == "read_file" and names[-1] == "list_dir"
        assert names.count("write_file") < 200  # a refused batch stored none of its rows
    finally:
        store.close()


class TestWorktreeOnAFailingDisk:
    """A worktree made on a state dir gone read-only (or full): the state dir's fault, StateError (exit 4,
    one line). Its checkout was a GitCommandError traceback (exit 1), and its registration a
    ConfigError (exit 2: cron and CI read a full disk as a typo) (found by a review)."""

    def test_a_worktree_registered_on_a_read_only_state_dir(self, tmp_path: Path, repo: Path, state_mount: Path) -> None:
        (state_mount / "worktrees").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(state_mount)], check=True)
        with pytest.raises(StateError, match=r"^cannot create the worktree of task 'fix-greet' at .*: .*Read-only file system"):
            Worktree.ensure(repo, state_mount, "fix-greet", "HEAD")
        assert git(repo, "branch", "--list", "overnight/fix-greet") == ""

    def test_a_worktree_checked_out_on_a_full_state_dir(self, tmp_path: Path, repo: Path, state_mount: Path) -> None:
        """git says only "unable to write file X" when the disk fills during the checkout (found by the fix-review)."""
        (repo / "big.bin").write_bytes(os.urandom(9 << 20))  # more than the 8 MiB tmpfs holds
        git(repo, "add", "big.bin")
        git(repo, "commit", "-q", "-m", "big")
        with pytest.raises(StateError, match=r"^cannot check out the files of task 'fix-greet' at .*(unable to write|No space)"):
            Worktree.ensure(repo, state_mount, "fix-greet", "HEAD")

    def test_a_worktree_checked_out_on_a_read_only_state_dir(self, tmp_path: Path, repo: Path, state_mount: Path) -> None:
        tree = Worktree.ensure(repo, state_mount, "fix-greet", "HEAD")
        # As a night killed between registering and checking out leaves it: no index yet.
        Path(git(tree.path, "rev-parse", "--git-dir"), "index").unlink()
        subprocess.run(["mount", "-o", "remount,ro", str(state_mount)], check=True)
        with pytest.raises(StateError, match=r"^cannot check out the files of task 'fix-greet' at .*Read-only file system"):
            Worktree.ensure(repo, state_mount, "fix-greet", "HEAD")


def _night_in_the_background(config: Any) -> subprocess.Popen[bytes]:
    """A real `overnight run` of `config`, in its own process, to kill."""
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config.source), "--log-format", "json"],
        cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )


def _counted(config: Any, query: str) -> int:
    """A count the running night's store gives, 0 before the store and its schema are made."""
    if not (config.state_dir / "runs.db").exists():
        return 0
    with contextlib.closing(sqlite3.connect(config.state_dir / "runs.db", timeout=5)) as db:
        try:
            return db.execute(query).fetchone()[0]
        except sqlite3.OperationalError:  # the schema is not made yet
            return 0


def _wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class TestKilledNight:
    def test_kill_9_mid_iteration_is_recovered(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """A real `overnight run` killed while an iteration had written files: recovery restores every invariant."""
        config = _config(tmp_path, repo, server.url, max_iterations=1)
        server.enqueue(
            call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}),
            call("submit", {"summary": "fixed"}),
            call("write_file", {"path": "greet.py", "content": "def greet():\n    return 'half done'\n"}),
            call("write_file", {"path": "build/out.pyc", "content": "ignored junk"}),
            Reply(text="thinking", delay_s=60),
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config.source), "--log-format", "json"],
            cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        )
        second = config.state_dir / "worktrees" / "second"
        try:
            _wait_for(lambda: (second / "build" / "out.pyc").exists() or proc.poll() is not None, 60, "the second task's files")
            assert proc.poll() is None, "the night ended before it could be killed"
        finally:
            proc.kill()
            proc.wait()
        committed = git(repo, "rev-parse", "overnight/fix-greet")
        settled, logs = recover(config)
        assert [(s.task_name, s.outcome, s.reason) for s in settled] == [("second", "interrupted", "interrupted")]
        assert git(second, "status", "--porcelain", "--ignored") == ""
        assert (second / "greet.py").read_text() == "def greet():\n    return 'helo'\n"
        assert git(repo, "rev-parse", "overnight/fix-greet") == committed
        assert "'hello'" in git(repo, "show", f"{committed}:greet.py")
        notes = NotesBook(config.state_dir / "notes.md")
        assert all(entry.reason != "interrupted" for entry in notes.entries())
        with sqlite3.connect(config.state_dir / "runs.db") as db:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            assert db.execute("SELECT count(*) FROM iterations WHERE outcome = 'running'").fetchone()[0] == 0
            assert db.execute("SELECT status FROM runs").fetchall() == [("crashed",)]
            assert db.execute("SELECT name, outcome, reason FROM task_runs ORDER BY id").fetchall() == [
                ("fix-greet", "succeeded", ""),
                ("second", "failed", "interrupted"),
            ]
        assert "iteration_recovered" in [e["event"] for e in logs]
        with StateLock(config.state_dir):
            pass  # the kernel freed whatever the dead night held

    def test_an_iteration_killed_after_its_commit_is_dated_to_its_death_not_to_its_recovery(
        self, tmp_path: Path, repo: Path, server: Any, capsys: Any
    ) -> None:
        """A real night killed right after an iteration's commit, before the store recorded it: recovered
        seconds later, the iteration, its task and its run end when the night was last seen alive (within a
        second of the death), not when recovery found them."""
        shims = tmp_path / "shims"  # the night's git: a commit made, it says so and waits there to be killed
        shims.mkdir()
        (shims / "git").write_text(
            f'#!/bin/sh\n[ "$1" = commit ] || exec {shutil.which("git")} "$@"\n'
            f'{shutil.which("git")} "$@" || exit $?\ntouch {tmp_path / "committed"}\nsleep 60\n'
        )
        (shims / "git").chmod(0o755)
        config = _config(tmp_path, repo, server.url, max_iterations=1)
        server.enqueue(call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}), call("submit", {"summary": "fixed"}))
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config.source), "--log-format", "json"],
            cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"},
        )
        try:
            _wait_for(lambda: (tmp_path / "committed").exists() or proc.poll() is not None, 60, "the iteration's commit")
            assert proc.poll() is None, "the night ended before it could be killed"
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # the night and its waiting git
            proc.wait()
        killed_at = datetime.now(timezone.utc)
        committed = git(repo, "rev-parse", "overnight/fix-greet")
        with contextlib.closing(sqlite3.connect(config.state_dir / "runs.db")) as db:
            assert db.execute("SELECT outcome FROM iterations").fetchall() == [("running",)]
        time.sleep(3)  # the next night comes later (hours, in life)

        [settled], _ = recover(config)
        assert (settled.outcome, settled.commit) == ("committed", committed)
        shown = report_json(config.source, capsys)["run"]  # the morning's report dates the run so
        reopened = RunStore.open(config.store_url)
        run = reopened.run(shown["id"])
        reopened.close()
        task, never_begun = run.tasks
        [iteration] = task.iterations
        assert (run.status, task.outcome, iteration.outcome, iteration.commit) == ("crashed", "succeeded", "committed", committed)
        assert (never_begun.outcome, never_begun.reason) == ("cancelled", "night_crashed")
        latest = killed_at + timedelta(seconds=1)  # a heartbeat's slack
        for ended in (iteration.finished_at, task.finished_at, never_begun.finished_at, run.finished_at):
            assert ended <= latest, f"ended {ended}, killed at {killed_at}"
        assert datetime.fromisoformat(shown["finished_at"]) <= latest
        assert iteration.finished_at >= iteration.started_at

    def test_the_note_a_night_killed_before_writing_it_owed_is_written_by_recovery(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """The store records a rollback with its note owed, then notes.md gets the entry: a night killed
        between the two (held here at the notes file's lock) owes the note, and recovery writes it from
        the store. An entry the night did write is not written twice."""
        import fcntl

        config = _config(tmp_path, repo, server.url, max_iterations=1)
        server.enqueue(
            call("submit", {"summary": "nothing fixed"}),
            call("read_file", {"path": "greet.py"}, delay_s=1.5),
            call("submit", {"summary": "nothing fixed either"}),
        )
        notes = NotesBook(config.state_dir / "notes.md")
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config.source), "--log-format", "json"],
            cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        )

        def second_rolled_back() -> bool:
            with contextlib.closing(sqlite3.connect(config.state_dir / "runs.db", timeout=5)) as db:
                rows = db.execute(
                    "SELECT i.outcome FROM iterations i JOIN task_runs t ON i.task_run_id = t.id WHERE t.name = 'second'"
                ).fetchall()
            return rows == [("rolled_back",)]

        lock = -1
        try:
            _wait_for(lambda: len(notes.entries()) == 1 or proc.poll() is not None, 60, "the first task's note")
            lock = os.open(config.state_dir / "notes.md.lock", os.O_RDWR)
            fcntl.flock(lock, fcntl.LOCK_EX)  # the second task's note now waits for it
            _wait_for(lambda: proc.poll() is not None or second_rolled_back(), 60, "the second task's rollback recorded")
            assert proc.poll() is None, "the night ended before it could be killed"
        finally:
            proc.kill()
            proc.wait()
            if lock >= 0:
                os.close(lock)
        assert [(e.task, e.reason) for e in notes.entries()] == [("fix-greet", "check_failed")]

        _, logs = recover(config)
        entries = notes.entries()
        assert [(e.task, e.iteration, e.reason) for e in entries] == [("fix-greet", 1, "check_failed"), ("second", 1, "check_failed")]
        assert "run_check" in entries[1].text  # the correction the store kept
        assert "Written by the next night's recovery" in entries[1].text
        assert [(e["task"], e["reason"]) for e in logs if e["event"] == "note_recovered"] == [("second", "check_failed")]
        recover(config)
        assert len(notes.entries()) == 2

    def test_an_entry_written_but_not_marked_is_not_written_again(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """The night wrote the entry, then died (or its store failed) before marking it written: recovery
        finds the entry (its header shows the very time the store has for the ending) and only marks it."""
        config = _config(tmp_path, repo, server.url, max_iterations=1)
        server.enqueue(call("submit", {"summary": "nothing fixed"}), call("submit", {"summary": "nor here"}))
        assert overnight("run", "--config", str(config.source)) == 1
        assert len(NotesBook(config.notes_path).entries()) == 2
        with contextlib.closing(sqlite3.connect(config.state_dir / "runs.db")) as db, db:
            db.execute("UPDATE iterations SET note_owed = 1")  # as a death between entry and mark leaves it
        _, logs = recover(config)
        assert len(NotesBook(config.notes_path).entries()) == 2
        assert "note_recovered" not in [e["event"] for e in logs]
        with contextlib.closing(sqlite3.connect(config.state_dir / "runs.db")) as db:
            assert db.execute("SELECT note_owed FROM iterations").fetchall() == [(0,), (0,)]

    def test_a_night_that_ends_owes_no_entry_and_a_pruned_notes_file_stays_pruned(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """The night marks each entry it wrote: the store owes none after it, and a notes.md the person emptied in the
        morning is not refilled by the next night's recovery."""
        config = _config(tmp_path, repo, server.url, max_iterations=1)
        server.enqueue(call("submit", {"summary": "nothing fixed"}), call("submit", {"summary": "nor here"}))
        assert overnight("run", "--config", str(config.source)) == 1
        assert len(NotesBook(config.notes_path).entries()) == 2
        with contextlib.closing(sqlite3.connect(config.state_dir / "runs.db")) as db:
            assert db.execute("SELECT note_owed FROM iterations").fetchall() == [(0,), (0,)]
        config.notes_path.unlink()  # read and pruned at breakfast
        _, logs = recover(config)
        assert NotesBook(config.notes_path).entries() == []
        assert "note_recovered" not in [e["event"] for e in logs]

    def test_an_owed_entry_headed_like_an_earlier_nights_is_still_written(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """Headers show the minute: a night killed in the same minute as an earlier night's same task, iteration
        number and reason (a restart loop) owed an entry that recovery took for the earlier one: lost."""
        config = _config(tmp_path, repo, server.url, max_iterations=1)
        server.enqueue(call("submit", {"summary": "nothing fixed"}), call("submit", {"summary": "nor here"}))
        assert overnight("run", "--config", str(config.source)) == 1
        store = RunStore.open(config.store_url)
        state_id = state_identity(config.state_dir)
        try:
            [earlier] = next(t for t in store.run(store.latest_run(state_id=state_id).id).tasks if t.name == "fix-greet").iterations
            run_id = store.begin_run(config_path=str(config.source), pid=os.getpid(), host=socket.gethostname(), state_id=state_id)
            task_run = store.begin_task(run_id, name="fix-greet", branch="overnight/fix-greet")
            iteration = store.begin_iteration(task_run, number=1, checkpoint="c" * 40, pid=os.getpid())
            store.finish_iteration(
                iteration, outcome="rolled_back", reason="check_failed", correction="run the check", note_owed=True, at=earlier.finished_at,
            )
            store.close_interrupted_run(run_id)
        finally:
            store.close()
        assert len(NotesBook(config.notes_path).entries()) == 2
        _, logs = recover(config)
        entries = NotesBook(config.notes_path).entries("fix-greet")
        assert len(entries) == 2 and entries[0].when == entries[1].when
        assert "Written by the next night's recovery" in entries[1].text
        assert [e["event"] for e in logs].count("note_recovered") == 1
        recover(config)
        assert len(NotesBook(config.notes_path).entries()) == 3

    def test_the_notes_a_running_copy_of_the_state_dir_owes_are_its_own(self, tmp_path: Path, repo: Path) -> None:
        """Owed notes are written for ended runs only: a run still `running` (a live copy of the state
        dir on another machine sharing the store) writes its own."""
        config = _config(tmp_path, repo)
        store = RunStore.open(config.store_url)  # makes the state dir
        state_id = state_identity(config.state_dir)
        try:
            run_id = store.begin_run(config_path=str(config.source), pid=os.getpid(), host="elsewhere", state_id=state_id)
            task_run = store.begin_task(run_id, name="fix-greet", branch="overnight/fix-greet")
            iteration = store.begin_iteration(task_run, number=1, checkpoint="c" * 40, pid=os.getpid())
            store.finish_iteration(iteration, outcome="rolled_back", reason="check_failed", correction="fix it", note_owed=True)
            assert store.owed_notes(state_id) == [] and store.owed_notes(None) == []
            store.finish_run(run_id, status="finished", exit_code=1)
            assert [it.id for it in store.owed_notes(state_id)] == [iteration]
        finally:
            store.close()

    def test_a_killed_night_is_told_as_it_is_before_and_after_recovery(self, tmp_path: Path, repo: Path, server: Any, capsys: Any) -> None:
        """The morning after a kill -9, before any night recovers it: the report says the process is gone
        and counts the turns and tokens its events hold; recovery then keeps those counts, and dates
        the end to when the night was last seen alive, not to when it was found."""
        from datetime import datetime, timezone

        config = _config(tmp_path, repo, server.url, max_iterations=1)
        server.enqueue(
            call("list_dir", {"path": "."}, prompt_tokens=100, completion_tokens=10),
            call("read_file", {"path": "greet.py"}, prompt_tokens=200, completion_tokens=20),
            call("read_file", {"path": "check_greet.py"}, prompt_tokens=300, completion_tokens=30),
            Reply(text="thinking", delay_s=60),
        )
        proc = _night_in_the_background(config)
        try:
            _wait_for(
                lambda: _counted(config, "SELECT count(*) FROM events WHERE type = 'model_call'") >= 3 or proc.poll() is not None,
                60, "three recorded model calls",
            )
            assert proc.poll() is None, "the night ended before it could be killed"
        finally:
            proc.kill()
            proc.wait()
        killed_at = datetime.now(timezone.utc)

        capsys.readouterr()
        assert overnight("report", "--config", str(config.source)) == 0
        text = capsys.readouterr().out
        assert f"running · but its process (pid {proc.pid}) is gone" in text.splitlines()[0]
        assert "#1 running · 3 turns · 660 tokens" in text

        time.sleep(0.05)
        recover(config)
        with contextlib.closing(sqlite3.connect(config.state_dir / "runs.db")) as db:
            outcome, turns, tokens, finished, beat = db.execute(
                "SELECT outcome, turns, tokens, finished_at, heartbeat_at FROM iterations"
            ).fetchone()
            [(run_finished,)] = db.execute("SELECT finished_at FROM runs").fetchall()
        assert (outcome, turns, tokens) == ("interrupted", 3, 660)
        assert finished == beat
        assert datetime.fromisoformat(run_finished).replace(tzinfo=timezone.utc) <= killed_at
        assert overnight("report", "--config", str(config.source)) == 0
        text = capsys.readouterr().out
        assert "crashed" in text.splitlines()[0] and "is gone" not in text
        assert "#1 interrupted · 3 turns · 660 tokens" in text  # the reason, the same word, said once


    def test_the_tasks_a_killed_night_never_began_are_in_its_account(self, tmp_path: Path, repo: Path, server: Any, capsys: Any) -> None:
        """A night killed while its first task ran never began the second: recovery records that one `cancelled`,
        reason `night_crashed`, with no iterations, so the dead run's report lists every task the night set out to work."""
        config = _config(tmp_path, repo, server.url, max_iterations=1)
        server.enqueue(Reply(text="thinking", delay_s=60))
        proc = _night_in_the_background(config)
        try:
            _wait_for(lambda: _counted(config, "SELECT count(*) FROM iterations") > 0 or proc.poll() is not None, 60, "the first task's iteration")
            assert proc.poll() is None, "the night ended before it could be killed"
        finally:
            proc.kill()
            proc.wait()
        with contextlib.closing(sqlite3.connect(config.state_dir / "runs.db")) as db:
            assert db.execute("SELECT name FROM task_runs").fetchall() == [("fix-greet",)]

        _, logs = recover(config)
        [recovered] = [e for e in logs if e["event"] == "run_recovered"]
        assert recovered["never_begun"] == ["second"]
        with contextlib.closing(sqlite3.connect(config.state_dir / "runs.db")) as db:
            assert db.execute("SELECT name, outcome, reason, position FROM task_runs ORDER BY position").fetchall() == [
                ("fix-greet", "failed", "interrupted", 0),
                ("second", "cancelled", "night_crashed", 1),
            ]
        report = report_json(config.source, capsys)
        assert report["run"]["status"] == "crashed"
        assert [(t["name"], t["outcome"], t["reason"], len(t["iterations"])) for t in report["tasks"]] == [
            ("fix-greet", "failed", "interrupted", 1),
            ("second", "cancelled", "night_crashed", 0),
        ]
        _, again = recover(config)  # settled once: nothing recorded twice
        assert "run_recovered" not in [e["event"] for e in again]
        assert len(report_json(config.source, capsys)["tasks"]) == 2


class TestKilledWhileTheAgentChangedGitConfig:
    def test_the_repositorys_config_is_put_back_by_the_next_night(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """The agent's `git config` in the user's repository is undone when its command ends; a night killed
        before that (kill -9, the OOM killer) left it changed for good (an outside review: a remote's URL
        pointed elsewhere). The config's bytes are kept in the state dir while agent commands run, and the
        next night's recovery puts them back."""
        git(repo, "remote", "add", "origin", "https://example.com/ours.git")
        before = (repo / ".git" / "config").read_bytes()
        task = {"name": "fix-greet", "prompt": "p", "check": "true", "tools": ["run_command", "submit"]}
        config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=[task])
        server.enqueue(call("run_command", {"command": "git config remote.origin.url https://evil.example/x.git && sleep 60"}))
        night = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 60
            while b"evil.example" not in (repo / ".git" / "config").read_bytes() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert b"evil.example" in (repo / ".git" / "config").read_bytes()
        finally:
            os.killpg(night.pid, signal.SIGKILL)
            night.wait()
        # Its folder of fences, which only its exit handler would have removed.
        import tempfile

        [left] = [f for f in Path(tempfile.gettempdir()).glob("overnight-agent-*") if (f / "pid").is_file() and (f / "pid").read_text() == str(night.pid)]
        settled, logs = recover(load_config(config))
        assert not left.exists() and str(left) in [e["path"] for e in logs if e["event"] == "agent_folder_removed"]
        assert (repo / ".git" / "config").read_bytes() == before
        assert [e["path"] for e in logs if e["event"] == "git_config_restored"] == [os.path.realpath(repo / ".git" / "config")]
        assert not list((tmp_path / "state").glob("git-config.kept*"))


class TestAStateDirOutlivingItsCheckout:
    """A state dir kept outside a checkout that is cloned afresh each night (a CI runner's workspace): its
    worktrees link to the registrations of a clone that is gone. The next night said `git worktree add`'s
    "already exists" (exit 2) for ever after."""

    @staticmethod
    def _clone_afresh(tmp_path: Path, repo: Path) -> None:
        """The checkout replaced by a new clone of where its branches were pushed, which takes them up."""
        git(tmp_path, "clone", "-q", "--bare", str(repo), str(tmp_path / "remote.git"))
        shutil.rmtree(repo)
        git(tmp_path, "clone", "-q", str(tmp_path / "remote.git"), str(repo))
        git(repo, "branch", "overnight/fix-greet", "origin/overnight/fix-greet")

    def test_a_worktree_holding_its_branchs_tip_is_made_anew(self, tmp_path: Path, repo: Path, server: Any, capsys: Any) -> None:
        from tests.test_night import FIX

        config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo)
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        fixed = git(repo, "rev-parse", "overnight/fix-greet")
        self._clone_afresh(tmp_path, repo)
        server.enqueue(call("submit", {"summary": "already fixed"}))
        capsys.readouterr()
        assert overnight("run", "--config", str(config)) == 0, capsys.readouterr().err[-500:]
        assert git(repo, "rev-parse", "overnight/fix-greet") == fixed  # built on, not started again from main
        assert not (tmp_path / "state" / "worktrees-set-aside").exists()
        assert git(tmp_path / "state" / "worktrees" / "fix-greet", "status", "--porcelain") == ""

    def test_a_worktree_holding_more_is_set_aside_whole(self, tmp_path: Path, repo: Path, server: Any, capsys: Any) -> None:
        from tests.test_night import FIX

        config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo)
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        (tmp_path / "state" / "worktrees" / "fix-greet" / "mine.txt").write_text("a person's edit\n")
        self._clone_afresh(tmp_path, repo)
        server.enqueue(call("submit", {"summary": "already fixed"}))
        capsys.readouterr()
        assert overnight("run", "--config", str(config)) == 0, capsys.readouterr().err[-500:]
        [aside] = (tmp_path / "state" / "worktrees-set-aside").iterdir()
        assert (aside / "mine.txt").read_text() == "a person's edit\n" and (aside / "greet.py").exists()
        assert not (tmp_path / "state" / "worktrees" / "fix-greet" / "mine.txt").exists()

    def test_the_worktree_of_a_night_killed_in_the_clone_that_is_gone(self, tmp_path: Path, repo: Path, server: Any, capsys: Any) -> None:
        """The job killed mid-iteration (a CI timeout), then a fresh clone: recovery met the dead iteration's
        worktree with no registration anywhere, and every later night exited 4. Its files are set aside
        (the agent's half-done edit, which a rollback would have undone, kept rather than lost), the
        iteration recorded `interrupted`, and the night goes on."""
        from tests.test_night import FIX

        config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, night={"max_iterations": 1})
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        self._clone_afresh(tmp_path, repo)
        server.enqueue(call("write_file", {"path": "half.txt", "content": "half done"}), Reply(text="thinking", delay_s=60))
        asked_before = len(server.requests)
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--log-format", "json"],
            cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        half = tmp_path / "state" / "worktrees" / "fix-greet" / "half.txt"
        try:
            # Killed once the silent reply is taken too: left queued (a kill before the night's next request), it was
            # the next night's first answer, and that night's watchdog stopped it.
            asked_both = lambda: half.exists() and len(server.requests) >= asked_before + 2  # noqa: E731
            _wait_for(lambda: asked_both() or proc.poll() is not None, 60, "the agent's file and its next request")
            assert proc.poll() is None, "the night ended before it could be killed"
        finally:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp_path / "remote.git")
        self._clone_afresh(tmp_path, repo)
        server.enqueue(call("submit", {"summary": "already fixed"}))
        capsys.readouterr()
        assert overnight("run", "--config", str(config)) == 0, capsys.readouterr().err[-500:]
        [aside] = (tmp_path / "state" / "worktrees-set-aside").iterdir()
        assert (aside / "half.txt").read_text() == "half done"
        with sqlite3.connect(tmp_path / "state" / "runs.db") as db:
            assert db.execute("SELECT outcome FROM iterations ORDER BY id").fetchall() == [("committed",), ("interrupted",), ("committed",)]

    def test_a_worktree_that_cannot_be_removed_whole_is_set_aside(self, tmp_path: Path, repo: Path, server: Any, capsys: Any) -> None:
        """An ignored file that may not be deleted (root's build output, here immutable): the removal left the
        folder, logged it removed, and git's "already exists" ended every night (exit 2)."""
        from tests.test_night import FIX

        config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo)
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        stuck = tmp_path / "state" / "worktrees" / "fix-greet" / "__pycache__" / "stuck.pyc"
        stuck.parent.mkdir(exist_ok=True)
        stuck.write_text("build output")
        if subprocess.run(["chattr", "+i", str(stuck)], capture_output=True).returncode != 0:
            pytest.skip("needs chattr +i (root, on a file system that has the flag)")
        try:
            self._clone_afresh(tmp_path, repo)
            server.enqueue(call("submit", {"summary": "already fixed"}))
            capsys.readouterr()
            assert overnight("run", "--config", str(config)) == 0, capsys.readouterr().err[-500:]
            [aside] = (tmp_path / "state" / "worktrees-set-aside").iterdir()
            assert (aside / "__pycache__" / "stuck.pyc").exists()
        finally:
            for found in (tmp_path / "state").rglob("stuck.pyc"):
                subprocess.run(["chattr", "-i", str(found)], capture_output=True)


class TestARepositoryWhereATasksWorktreeGoes:
    """A night never rewrites, rolls back or deletes a repository a person put where a task's worktree goes: the task is
    skipped (`branch_checked_out`), the folder left as it is (`worktree_folder_kept`)."""

    @staticmethod
    @contextlib.contextmanager
    def killed_after_the_agents_edit(config: Path, path: Path, server: Any) -> Iterator[None]:
        """A real night whose agent wrote greet.py in the task's worktree, then waits on the model: the block runs then,
        and the night is killed (SIGKILL) at its end."""
        server.enqueue(call("write_file", {"path": "greet.py", "content": "agent\n"}), Reply(text="thinking", delay_s=60))
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--log-format", "json"],
            cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        )
        try:
            _wait_for(lambda: (path / "greet.py").exists() and (path / "greet.py").read_text() == "agent\n" or proc.poll() is not None, 60, "the agent's edit")
            assert proc.poll() is None, "the night ended before it could be killed"
            yield
        finally:
            proc.kill()
            proc.wait()

    @staticmethod
    def night(config: Path) -> subprocess.CompletedProcess[str]:
        """The real `overnight run`, in a child process."""
        return subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--log-format", "json"],
            cwd=REPO_ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120,
            env={**os.environ, "NO_COLOR": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        )

    @staticmethod
    def ended(done: subprocess.CompletedProcess[str]) -> tuple[int, str, str]:
        """The night's exit code, and how its one task ended."""
        [finished] = [json.loads(line) for line in done.stderr.splitlines() if '"task_finished"' in line]
        return done.returncode, finished["outcome"], finished["reason"]

    @staticmethod
    def kept_lines(stderr: str) -> list[dict[str, Any]]:
        events = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
        return [e for e in events if e.get("event") == "worktree_folder_kept" and e.get("task") == "fix-greet"]

    def test_a_persons_clone_in_a_folder_a_stale_registration_names_keeps_its_history(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """The task's worktree deleted by hand (no `git worktree prune`), a person's clone made in its folder: the night
        adopted it through the stale registration and replaced the clone's `.git` folder, its history, with a link."""
        config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, night={"max_iterations": 1})
        worktree = Worktree.ensure(repo, tmp_path / "state", "fix-greet", "HEAD")
        shutil.rmtree(worktree.path)
        git(tmp_path, "clone", "-q", str(repo), str(worktree.path))
        (worktree.path / "mine.txt").write_text("my own work\n")
        git(worktree.path, "add", "mine.txt")
        git(worktree.path, "commit", "-qm", "my own commit")
        server.enqueue(call("submit", {"summary": "x"}))
        done = self.night(config)
        assert (worktree.path / ".git").is_dir(), done.stderr
        assert git(worktree.path, "log", "-1", "--format=%s") == "my own commit"
        # The night's line, after the pre-night clean-up's own ("not a worktree of this repository").
        assert "a repository of its own (its .git is a folder): left as it is, the task skipped" in [e["why"] for e in self.kept_lines(done.stderr)]
        assert self.ended(done) == (1, "skipped", "branch_checked_out")

    def test_the_original_repositorys_worktree_is_left_to_it_after_a_copy(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """`cp -r repo copy`, `[repo] path` the copy, the state dir shared: the copy registers the original's task worktree
        too; the night linked it to the copy and its rollback deleted a person's edit there."""
        worktree = Worktree.ensure(repo, tmp_path / "state", "fix-greet", "HEAD")
        (worktree.path / "REVIEW.md").write_text("my review\n")
        (worktree.path / "greet.py").write_text("# my edit\n")
        shutil.copytree(repo, tmp_path / "copy", symlinks=True)
        config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=tmp_path / "copy", night={"max_iterations": 1})
        server.enqueue(call("write_file", {"path": "greet.py", "content": "agent\n"}), call("submit", {"summary": "x"}))
        done = self.night(config)
        assert (worktree.path / "REVIEW.md").read_text() == "my review\n", done.stderr
        assert (worktree.path / "greet.py").read_text() == "# my edit\n"
        common = git(worktree.path, "rev-parse", "--path-format=absolute", "--git-common-dir")
        assert Path(common) == (repo / ".git").resolve()
        assert [e["at"] for e in self.kept_lines(done.stderr) if e["why"].startswith("a worktree of another repository")] == [str(worktree.path)]
        assert self.ended(done) == (1, "skipped", "branch_checked_out")

    def test_the_agents_git_init_in_a_killed_nights_worktree_is_undone_the_next_night(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """The agent replaced its worktree's `.git` link with `git init` and the night was killed then: the folder is
        still the task's (registered, marked), so the next night undoes the agent's repository and works the task."""
        config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, night={"max_iterations": 1})
        path = tmp_path / "state" / "worktrees" / "fix-greet"
        with self.killed_after_the_agents_edit(config, path, server):
            (path / ".git").unlink()  # what the agent's `rm .git && git init` does
            git(path, "init", "-q")
        server.enqueue(call("submit", {"summary": "x"}))
        done = self.night(config)
        assert self.kept_lines(done.stderr) == [], done.stderr
        assert (path / ".git").is_file(), done.stderr
        assert Path(git(path, "rev-parse", "--path-format=absolute", "--git-common-dir")) == (repo / ".git").resolve()
        assert self.ended(done)[1:] != ("skipped", "branch_checked_out"), done.stderr

    def test_a_persons_clone_moved_into_a_killed_nights_worktree_keeps_its_history(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """The night killed mid-iteration, a person's older clone moved where the worktree was: recovery leaves it (not
        the agent's `git init`, its repository is older than the iteration), and the next night skips the task."""
        config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, night={"max_iterations": 1})
        path = tmp_path / "state" / "worktrees" / "fix-greet"
        mine = tmp_path / "mine"
        git(tmp_path, "clone", "-q", str(repo), str(mine))
        (mine / "mine.txt").write_text("my own work\n")
        git(mine, "add", "mine.txt")
        git(mine, "commit", "-qm", "my own commit")
        time.sleep(2.5)  # past the slack a recorded start is allowed
        with self.killed_after_the_agents_edit(config, path, server):
            pass
        shutil.rmtree(path)
        mine.rename(path)
        done = self.night(config)
        assert (path / ".git").is_dir(), done.stderr
        assert git(path, "log", "-1", "--format=%s") == "my own commit"
        assert (path / "mine.txt").read_text() == "my own work\n"
        assert any(e["why"].startswith("a repository of its own") for e in self.kept_lines(done.stderr)), done.stderr
        assert self.ended(done) == (1, "skipped", "branch_checked_out")


class TestKilledWhileTheAgentBrokeItsGitLink:
    """A real night killed (SIGKILL) while its agent had written garbage into its worktree's `.git` link, the state dir
    outside the checkout (`[state] dir` elsewhere): every later `overnight run` exited 4, "no repository registers it"."""

    @pytest.mark.parametrize("link", [b"gitdir: /nonexistent\n", b"\x8f\x00garbage\xff"], ids=["gone", "bytes"])
    def test_the_next_night_relinks_rolls_back_and_runs(self, tmp_path: Path, repo: Path, server: Any, link: bytes) -> None:
        """Recovery finds the registration in the configured repository, puts the link back, rolls the agent's edit
        back and records the iteration `interrupted`; the night then works the task."""
        config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, night={"max_iterations": 1})
        path = tmp_path / "state" / "worktrees" / "fix-greet"
        assert not path.resolve().is_relative_to(repo.resolve())
        with TestARepositoryWhereATasksWorktreeGoes.killed_after_the_agents_edit(config, path, server):
            (path / ".git").write_bytes(link)
        server.enqueue(call("submit", {"summary": "x"}))
        done = TestARepositoryWhereATasksWorktreeGoes.night(config)
        assert done.returncode != 4, done.stderr
        recovered = [json.loads(line) for line in done.stderr.splitlines() if '"iteration_recovered"' in line]
        assert [e["outcome"] for e in recovered] == ["interrupted"], done.stderr
        assert (path / ".git").is_file() and (path / "greet.py").read_text() != "agent\n"
        assert Path(git(path, "rev-parse", "--path-format=absolute", "--git-common-dir")) == (repo / ".git").resolve()
        assert TestARepositoryWhereATasksWorktreeGoes.ended(done)[1:] != ("skipped", "branch_checked_out"), done.stderr
