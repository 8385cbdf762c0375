"""A run read while a night (or another machine's recovery) commits: one snapshot of the store, on SQLite and PostgreSQL.

The reader reads a run in several statements (the run, its tasks, their iterations, their events). A write committed
between two of them, by another connection (SQLAlchemy's before_cursor_execute on the reader's engine holds it there),
must leave the reader's view as the store was before that write or after it, never a mix of both; and `overnight report
--json`, asked in a loop while a real `overnight run` works, never answers with what no one moment of the store held."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import sqlalchemy

from orchestrator.records import Level
from orchestrator.scripted import call
from runs import RunStore
from runs.views import RunView
from tests.conftest import write_config
from tests.test_night import overnight


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: Any, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state' / 'runs.db'}"
    return request.getfixturevalue("pg_store_url")


@pytest.fixture
def night(url: str) -> Iterator[RunStore]:
    """The night's own store, which writes while the reader reads."""
    opened = RunStore.open(url)
    yield opened
    opened.close()


@pytest.fixture
def reader(url: str, night: RunStore) -> Iterator[RunStore]:
    """The store `overnight report` (or `serve`) opens: another engine on the same database."""
    opened = RunStore.open(url)
    yield opened
    opened.close()


def _a_night_at_work(night: RunStore) -> tuple[int, int]:
    """A running run with one running task whose first iteration made one model call: the run's and the iteration's ids."""
    run_id = night.begin_run(config_path="/repo/overnight.toml", pid=100, host="box")
    task_id = night.begin_task(run_id, name="fix-greet", branch="overnight/fix-greet", position=0)
    iteration_id = night.begin_iteration(task_id, number=1, checkpoint="abc123", pid=100)
    night.record_model_call(iteration_id, prompt_tokens=100, completion_tokens=20, latency_ms=5)
    night.flush()
    return run_id, iteration_id


def _read_while_committing(reader: RunStore, before: str, write: Callable[[], None]) -> tuple[RunView, RunView, RunView]:
    """The run as read before `write`, as read with `write` committed just before the reader's first statement holding
    `before` (its SQL, lower case), and as read after it."""
    first = reader.latest_run()
    written = False

    def commit_in_between(_connection: Any, _cursor: Any, statement: str, *_: Any) -> None:
        nonlocal written
        if not written and before in statement.lower():
            written = True
            write()

    sqlalchemy.event.listen(reader._engine, "before_cursor_execute", commit_in_between)
    try:
        during = reader.latest_run()
    finally:
        sqlalchemy.event.remove(reader._engine, "before_cursor_execute", commit_in_between)
    assert written
    after = reader.latest_run()
    assert first is not None and during is not None and after is not None and first != after
    return first, during, after


def test_events_committed_between_reading_the_signals_and_the_calls_are_read_as_one(night: RunStore, reader: RunStore) -> None:
    """A guard's signal and the model call after it, committed while the reader is between an iteration's signals
    and its calls, are both in its view or both not (read apart: the call's turn and tokens, without the signal)."""
    _, iteration_id = _a_night_at_work(night)

    def signal_then_a_call() -> None:
        night.record_signal(iteration_id, level=Level.WARNING, kind="repeated_tool_call", message="read_file x3")
        night.record_model_call(iteration_id, prompt_tokens=100, completion_tokens=30, latency_ms=5)
        night.flush()

    before, during, after = _read_while_committing(reader, "count(", signal_then_a_call)
    iteration = during.tasks[0].iterations[0]
    assert (len(iteration.signals), iteration.turns, iteration.tokens) in {(0, 1, 120), (1, 2, 250)}
    assert during in (before, after)


def test_a_run_closed_between_reading_it_and_its_tasks_is_read_as_one(night: RunStore, reader: RunStore, url: str) -> None:
    """Recovery (another machine's, in a shared store) closing a dead run in one transaction while the reader is between
    the run's row and its tasks': the view is the run running with its task running, or crashed with its task failed
    (read apart: `running` above a task the night's crash already failed)."""
    run_id, _ = _a_night_at_work(night)
    recovery = RunStore.open(url)
    try:
        before, during, after = _read_while_committing(reader, "from task_runs", lambda: recovery.close_interrupted_run(run_id))
    finally:
        recovery.close()
    assert (during.status, during.tasks[0].outcome) in {("running", "running"), ("crashed", "failed")}
    assert during in (before, after)


# Each task's script: the third identical look is a guard's reminder (a `repeated_tool_call` signal) before the fourth
# model call, then the fix. So any one moment of the store shows an iteration past its fourth call with that signal.
_LOOKS_THEN_FIXES = [
    *[call("list_dir", {"path": "."})] * 3,
    call("read_file", {"path": "greet.py"}),
    call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}),
    call("run_check", {}),
    call("submit", {"summary": "fixed the typo"}),
]
_NIGHT_TASKS = 16


def _disagreements(answer: dict[str, Any]) -> list[str]:
    """What in one `report --json` answer no single moment of the store shows."""
    found = []
    run, tasks = answer["run"], answer["tasks"]
    if run["status"] != "running" and any(task["outcome"] == "running" for task in tasks):
        found.append(f"run {run['status']} with a task running")
    if run["tokens"] != sum(task["tokens"] for task in tasks):
        found.append("the run's tokens are not its tasks'")
    for task in tasks:
        iterations = task["iterations"]
        if task["tokens"] != sum(it["tokens"] for it in iterations) + task["unused_tokens"]:
            found.append(f"{task['name']}: tokens are not its iterations'")
        if [it["number"] for it in iterations] != list(range(1, len(iterations) + 1)):
            found.append(f"{task['name']}: iterations numbered {[it['number'] for it in iterations]}")
        if task["outcome"] != "running" and any(it["outcome"] == "running" for it in iterations):
            found.append(f"{task['name']}: {task['outcome']} with an iteration running")
        for it in iterations:
            if it["turns"] >= 4 and not any(s["kind"] == "repeated_tool_call" for s in it["signals"]):
                found.append(f"{task['name']} #{it['number']}: {it['turns']} turns without the third call's signal")
    return found


def test_reports_taken_while_a_night_runs_each_show_one_moment(tmp_path: Path, repo: Path, server: Any, capsys: Any) -> None:
    """`overnight report --json`, asked again and again while a real `overnight run` works many tasks, answers each time
    with what one moment of the store holds: no task ended with an iteration running, tokens that add up, and an
    iteration past its fourth call carrying the signal written before that call."""
    fix_greet = {"prompt": "greet() should return 'hello'.", "check": "python check_greet.py"}
    tasks = [{"name": f"task-{n:02}", **fix_greet} for n in range(_NIGHT_TASKS)]
    night_keys = {"max_iterations": 1, "max_turns": 12}
    config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=tasks, night=night_keys)
    for _ in tasks:
        server.enqueue(*_LOOKS_THEN_FIXES)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    command = [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config)]
    log = tmp_path / "night.log"  # a file, not a pipe: the night's log would fill a pipe nobody reads until it ends
    with log.open("wb") as night_log:
        night = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=night_log)
    answers, problems = 0, []
    try:
        while night.poll() is None:
            exit_code, out = overnight("report", "--config", str(config), "--json"), capsys.readouterr().out
            if exit_code == 0:  # not before the night's run is recorded
                answers += 1
                problems += _disagreements(json.loads(out))
    finally:
        night.wait(timeout=120)
    assert night.returncode == 0, log.read_text(errors="replace")[-2000:]
    assert overnight("report", "--config", str(config), "--json") == 0
    final = json.loads(capsys.readouterr().out)
    assert [task["outcome"] for task in final["tasks"]] == ["succeeded"] * _NIGHT_TASKS
    assert all(task["iterations"][0]["signals"][0]["kind"] == "repeated_tool_call" for task in final["tasks"])
    assert answers > _NIGHT_TASKS
    assert problems == [], f"{len(problems)} of {answers} answers"
