"""A run store that fails for a moment and comes back: real SQLite, locked by another connection.

The fault is SQLite's own: a second connection holds the write lock (`BEGIN EXCLUSIVE`), and every
other writer waits its busy timeout, then fails with "database is locked"; once the holder lets go,
the store writes again. No module of overnight's is mocked.
"""

from __future__ import annotations

import json
import shlex
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import structlog

from orchestrator.config import load_config
from orchestrator.errors import StateError
from orchestrator.leases import LeaseKeeper
from runs import RunStore
from tests.conftest import git, write_config
from tests.test_faults import recover
from tests.test_night import FIX, overnight


def hold_the_database(path: Path, seconds: float) -> threading.Thread:
    """Another connection holding `path`'s write lock for `seconds` (begun when this returns); join the thread for its end."""
    held = threading.Event()

    def hold() -> None:
        connection = sqlite3.connect(path, isolation_level=None)
        try:
            connection.execute("BEGIN EXCLUSIVE")
            held.set()
            time.sleep(seconds)
            connection.execute("ROLLBACK")
        finally:
            connection.close()

    holder = threading.Thread(target=hold, name="database-holder", daemon=True)
    holder.start()
    assert held.wait(10), "the holder never got the lock"
    return holder


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Path]:
    """A store's SQLite file, its tables made (the holder locks a database in WAL mode, as the night's is)."""
    path = tmp_path / "runs.db"
    RunStore.open(f"sqlite:///{path}").close()
    yield path


class TestBusyTimeout:
    def test_a_write_waits_out_another_connection_longer_than_the_drivers_own_timeout(self, database: Path) -> None:
        """The store's busy timeout (30 s): a write waits for another process's transaction to end, here
        longer than the driver's default 5 s, instead of failing the night with "database is locked"."""
        store = RunStore.open(f"sqlite:///{database}")
        try:
            holder = hold_the_database(database, 5.4)
            run_id = store.begin_run(config_path="c", pid=1, host="h")
            holder.join()
            assert store.run(run_id).status == "running"
        finally:
            store.close()

    def test_the_urls_own_timeout_is_the_busy_timeout(self, database: Path) -> None:
        """`?timeout=S` in the URL (the driver's, accepted at load) was overwritten by the 30 s default:
        a write waited the 30 s all the same. Now it fails after S, and the same store writes again
        once the holder lets go."""
        store = RunStore.open(f"sqlite:///{database}?timeout=0.2")
        try:
            holder = hold_the_database(database, 1.5)
            with pytest.raises(StateError, match="begin_run failed: database is locked"):  # not waited out
                store.begin_run(config_path="c", pid=1, host="h")
            holder.join()
            run_id = store.begin_run(config_path="c", pid=1, host="h")
            assert store.run(run_id).status == "running"
        finally:
            store.close()


def test_the_lease_keeper_renews_on_after_the_store_refused_a_renewal(database: Path) -> None:
    """A renewal the locked store refuses is logged (`lease_renew_failed`) and the next beat renews: the
    lease never lapses. A keeper that stopped renewing after the failure let it expire at its ttl."""
    store = RunStore.open(f"sqlite:///{database}?timeout=0.1")
    try:
        with structlog.testing.capture_logs() as logs, LeaseKeeper(store, "t", ttl_s=1.5, log=structlog.get_logger()) as keeper:
            acquired = time.monotonic()
            hold_the_database(database, 0.8).join()  # the beat at 0.5 s waits 0.1 s, then fails
            assert {entry["event"] for entry in logs} == {"lease_renew_failed"}
            assert "database is locked" in logs[0]["error"]
            while time.monotonic() - acquired < 2.7:  # past the ttl after the last renewal before the lock
                assert not store.acquire_lease("t", "intruder", 30)
                time.sleep(0.05)
            assert not keeper.lost.is_set()
        assert store.leases() == []
    finally:
        store.close()


def test_a_release_the_locked_store_refuses_is_logged_and_the_lease_lapses_at_its_ttl(database: Path) -> None:
    """The store is locked as the task ends: `lease_release_failed` (`task`, `owner`, `error`), not an error
    of the task's; the lease is left to its ttl, and another worker takes the task after it."""
    store = RunStore.open(f"sqlite:///{database}?timeout=0.1")
    try:
        with structlog.testing.capture_logs() as logs:
            with LeaseKeeper(store, "t", ttl_s=0.6, log=structlog.get_logger()) as keeper:
                holder = hold_the_database(database, 0.5)  # over the release's 0.1 s wait, under the next beat's
            released_at = time.monotonic()
            holder.join()
        assert [entry["event"] for entry in logs] == ["lease_release_failed"], logs
        assert logs[0]["task"] == "t" and logs[0]["owner"] == keeper.owner and "database is locked" in logs[0]["error"]
        assert [lease.owner for lease in store.leases()] == [keeper.owner]  # still there: not released
        while not store.acquire_lease("t", "next-worker", 30):
            assert time.monotonic() - released_at < 5, "the lease never lapsed"
            time.sleep(0.05)
    finally:
        store.close()


# The clean filter of greet.py: the first time it cleans the fixed file (overnight's `git add` of the
# iteration's commit, after the lease was renewed), it starts a process that takes the store's write
# lock, and waits until it has it. That process lets go once the file named `until` exists.
FAULT_FILTER = textwrap.dedent(
    """
    import os, sqlite3, subprocess, sys, time
    from pathlib import Path

    if sys.argv[1] == "hold":
        database, held, until = sys.argv[2:5]
        connection = sqlite3.connect(database, isolation_level=None)
        connection.execute("BEGIN EXCLUSIVE")
        Path(held).touch()
        deadline = time.monotonic() + 20
        while not os.path.exists(until) and time.monotonic() < deadline:
            time.sleep(0.01)
        connection.execute("ROLLBACK")
        Path(held).unlink()
        sys.exit(0)

    database, folder, until = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    data = sys.stdin.buffer.read()
    if b"'hello'" in data and not (folder / "fired").exists():
        (folder / "fired").touch()
        if until == "ORIG_HEAD":  # written by the next `git reset` in this worktree: the rollback's
            git_path = subprocess.run(["git", "rev-parse", "--git-path", "ORIG_HEAD"], capture_output=True, text=True, check=True)
            until = os.path.abspath(git_path.stdout.strip())
            Path(until).unlink(missing_ok=True)
        held = folder / "held"
        subprocess.Popen(
            [sys.executable, __file__, "hold", database, str(held), until],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        deadline = time.monotonic() + 20
        while not held.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    sys.stdout.buffer.write(data)
    """
)


class TestStoreFailingAsTheCommitIsRecorded:
    """The iteration's work passed the check and is committed; the store fails as it records that. The
    commit stays on the branch (exit 4, as for any store failure), and the store says so."""

    def _night(self, tmp_path: Path, repo: Path, server: Any, *args: str, until: str) -> tuple[int, Any]:
        config = self._setup(tmp_path, repo, server, until=until)
        return overnight("run", "--config", str(config), *args), load_config(config)

    def _setup(self, tmp_path: Path, repo: Path, server: Any, *, until: str) -> Path:
        """The config of a night whose store a clean filter locks as the fix is committed, until `until` exists."""
        folder = tmp_path / "fault"
        folder.mkdir()
        (folder / "filter.py").write_text(FAULT_FILTER)
        database = tmp_path / "state" / "runs.db"
        (repo / ".gitattributes").write_text("greet.py filter=fault\n")
        git(repo, "add", ".gitattributes")
        git(repo, "commit", "-q", "-m", "a filter")
        command = " ".join(shlex.quote(part) for part in (sys.executable, str(folder / "filter.py"), str(database), str(folder), until))
        git(repo, "config", "filter.fault.clean", command)
        config = write_config(
            tmp_path / "overnight.toml", api_base=server.url, repo=repo, night={"max_iterations": 1},
            extra=f'[store]\nurl = "sqlite:///{database}?timeout=1"\n',
        )
        server.enqueue(*FIX)
        return config

    def _account(self, config: Any) -> tuple[Any, Any]:
        store = RunStore.open(config.store_url)
        try:
            run = store.latest_run()
        finally:
            store.close()
        [task] = run.tasks
        return run, task

    def test_a_store_back_a_moment_later_records_the_commit(self, tmp_path: Path, repo: Path, server: Any, capsys: Any) -> None:
        """The store locked as the commit is recorded, free again by the time the iteration's end is
        written once more: it said `rolled_back` (iteration_error) and the task `failed`, while the
        branch held the commit. Now the iteration is `committed` and the task `succeeded`, with it."""
        code, config = self._night(tmp_path, repo, server, "--log-format", "json", until="ORIG_HEAD")
        lines = capsys.readouterr().err.strip().splitlines()
        assert code == 4 and "database is locked" in lines[-1], lines[-1]
        tip = git(repo, "rev-parse", "overnight/fix-greet")
        assert "'hello'" in git(repo, "show", f"{tip}:greet.py")
        run, task = self._account(config)
        assert (run.status, run.exit_code) == ("crashed", 4)
        assert [(it.outcome, it.reason, it.commit) for it in task.iterations] == [("committed", "", tip)]
        assert (task.outcome, task.commit) == ("succeeded", tip)
        # The log tells what the store has: the commit (it said only iteration_state_failed, "rolled back").
        events = [json.loads(line) for line in lines if line.startswith("{")]
        endings = [e for e in events if e["event"] in ("iteration_committed", "iteration_state_failed")]
        assert [e["event"] for e in endings] == ["iteration_committed", "iteration_state_failed"], endings
        [it] = task.iterations
        assert (endings[0]["commit"], endings[0]["turns"], endings[0]["tokens"]) == (tip[:12], it.turns, it.tokens)

    def test_a_store_down_for_the_rest_of_the_night_leaves_the_commit_to_recovery(
        self, tmp_path: Path, repo: Path, server: Any, capsys: Any
    ) -> None:
        """The store stays locked past the night's end: nothing more is recorded, the commit stays on the
        branch, and the next night's recovery records it (the iteration `committed`, the task `succeeded`)."""
        release = tmp_path / "fault" / "release"
        code, config = self._night(tmp_path, repo, server, until=str(release))
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert code == 4 and "database is locked" in last, last
        tip = git(repo, "rev-parse", "overnight/fix-greet")
        assert "'hello'" in git(repo, "show", f"{tip}:greet.py")
        release.touch()
        deadline = time.monotonic() + 10
        while (tmp_path / "fault" / "held").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        settled, _ = recover(config)
        assert [(it.outcome, it.commit) for it in settled] == [("committed", tip)]
        run, task = self._account(config)
        assert run.status == "crashed"
        assert [(it.outcome, it.commit) for it in task.iterations] == [("committed", tip)]
        assert (task.outcome, task.commit) == ("succeeded", tip)
        assert git(repo, "rev-parse", "overnight/fix-greet") == tip

    def test_a_store_back_only_for_the_runs_end_leaves_the_task_to_recovery(self, tmp_path: Path, repo: Path, server: Any) -> None:
        """The store fails as the commit is recorded and again as that is retried, then comes back for
        the run's own end, which closes the task `failed` (interrupted) with the iteration still open.
        The next night's recovery records the commit and the task with it: `succeeded`, not failed."""
        release = tmp_path / "fault" / "release"
        config_path = self._setup(tmp_path, repo, server, until=str(release))
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config_path), "--log-format", "json"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        lines = []
        for line in process.stderr:  # the holder lets go once the retry, too, has failed
            lines.append(line)
            if '"iteration_state_failed"' in line:
                release.touch()
        assert process.wait(timeout=60) == 4, "".join(lines)
        config = load_config(config_path)
        tip = git(repo, "rev-parse", "overnight/fix-greet")
        run, task = self._account(config)
        assert (run.status, [it.outcome for it in task.iterations]) == ("crashed", ["running"]), "".join(lines)
        assert (task.outcome, task.reason) == ("failed", "interrupted")
        settled, _ = recover(config)
        assert [(it.outcome, it.commit) for it in settled] == [("committed", tip)]
        run, task = self._account(config)
        assert [(it.outcome, it.commit) for it in task.iterations] == [("committed", tip)]
        assert (task.outcome, task.reason, task.commit) == ("succeeded", "", tip)
