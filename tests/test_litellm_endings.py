"""Whole nights through the litellm transport at concurrency 4 that end while every task's answer streams: a SIGTERM, the
`[night] deadline`, a task's lease taken by another worker. Each cut answer is hung up on by the client (the process does
not wait for the streams' ends), counted, rolled back and noted, and nothing is left open."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from orchestrator.cancel import seconds_between
from orchestrator.fake_server import ScriptedServer
from orchestrator.notes import NotesBook
from orchestrator.scripted import Reply, call
from tests.conftest import git, write_config
from tests.test_litellm_nights import assert_nothing_left_open
from tests.test_night import report_json

TASK_NAMES = [f"t{n}" for n in range(4)]
TASKS = [{"name": name, "prompt": f"Work on {name}.", "check": "false", "tools": ["write_file", "submit"]} for name in TASK_NAMES]
# `overnight <words>` with the night's clock and a task's lease heartbeat swapped, as argv[1] (JSON) says: `jump_at`, a
# file that, once it exists, moves the clock from 06:00 to past 06:30 (the deadline comes when the test says); `lease_ttl_s`,
# a lease lost is seen within a third of it, not the 20 s of the default 60 s ttl.
OVERNIGHT_WITH = textwrap.dedent("""
    import functools, json, os, sys, time
    from datetime import datetime, timedelta, timezone
    swaps, words = json.loads(sys.argv[1]), sys.argv[2:]
    sys.argv = ["overnight", *words]
    import orchestrator.build as build
    import orchestrator.task_night as task_night
    if "jump_at" in swaps:
        began = time.monotonic()
        def now():
            at = datetime(2026, 12, 7, 6, 31 if os.path.exists(swaps["jump_at"]) else 0, tzinfo=timezone.utc)
            return at + timedelta(seconds=time.monotonic() - began)
        build.NightParts = functools.partial(build.NightParts, now=now)
    if "lease_ttl_s" in swaps:
        task_night.LeaseKeeper = functools.partial(task_night.LeaseKeeper, ttl_s=swaps["lease_ttl_s"])
    import orchestrator.cli as cli
    cli.entry()
""")


def streamed_for(seconds: float) -> Reply:
    """An answer that streams for about `seconds`, then submits."""
    interval = 0.05
    # Words that do not repeat: a repeated one is runaway output, which a guard cuts.
    text = " ".join(f"w{n:04d}" for n in range(int(seconds / interval)))
    return Reply(text=text, chunk_chars=6, chunk_interval_s=interval, tool_calls=call("submit", {"summary": "x"}).tool_calls)


def streaming_answers(seconds: float, t0_seconds: float | None = None) -> tuple[Callable[[dict[str, Any]], Reply], list[dict[str, Any]]]:
    """A responder for every task at once, whichever asks first: a task's first call writes scratch.txt (its worktree
    changed), the next streams for about `seconds` (task t0's for `t0_seconds`, if given) and then submits. The second
    part lists the streamed requests."""
    streamed: list[dict[str, Any]] = []
    lock = threading.Lock()
    slow, slow_t0 = streamed_for(seconds), streamed_for(t0_seconds or seconds)

    def answer(body: dict[str, Any]) -> Reply:
        messages = body.get("messages", ())
        if not any(message.get("role") == "tool" for message in messages):
            return call("write_file", {"path": "scratch.txt", "content": "half done"})
        with lock:
            streamed.append(body)
        return slow_t0 if any("Work on t0." in str(message.get("content")) for message in messages) else slow

    return answer, streamed


def start_night(folder: Path, server: ScriptedServer, swaps: dict[str, Any], **night: Any) -> tuple[subprocess.Popen[str], Path]:
    """`overnight run --log-format json` at concurrency 4 through litellm (OVERNIGHT_WITH's `swaps`), ResourceWarnings shown."""
    config = write_config(
        folder / "overnight.toml", api_base=server.url, repo=folder / "repo", tasks=TASKS,
        model={"transport": "litellm", "request_timeout_s": 60}, night={"concurrency": 4, "max_iterations": 1, **night},
    )
    process = subprocess.Popen(
        [sys.executable, "-c", OVERNIGHT_WITH, json.dumps(swaps), "run", "--config", str(config), "--log-format", "json"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "NO_COLOR": "1", "PYTHONWARNINGS": "default", "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    return process, config


def wait_until_every_task_streams(process: subprocess.Popen[str], config: Path, streamed: list[dict[str, Any]]) -> None:
    """Until all four tasks have written scratch.txt and their answers stream (a minute at most on a loaded machine)."""
    worktrees = config.parent / "state" / "worktrees"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if len(streamed) == len(TASKS) and all((worktrees / name / "scratch.txt").exists() for name in TASK_NAMES):
            time.sleep(0.5)  # the answers' first chunks are read
            return
        time.sleep(0.05)
    process.kill()
    raise AssertionError(f"the four answers never streamed together: {len(streamed)} streamed; {process.communicate()[1][-3000:]}")


def ended_within(process: subprocess.Popen[str], seconds: float) -> str:
    """The night's stderr, once it has exited; it must within `seconds` (its answers would stream on for far longer)."""
    try:
        return process.communicate(timeout=seconds)[1]
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError(f"still running {seconds} s after its end was called: {process.communicate()[1][-3000:]}") from None


def events(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.strip()]


def at(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(event["timestamp"])


def assert_cut_and_rolled_back(
    config: Path, server: ScriptedServer, logged: list[dict[str, Any]], cut: list[str], why: str, hung_up_by: float
) -> None:
    """Each of the `cut` tasks' iteration was cancelled for `why` with its streamed tokens counted, its worktree rolled
    back and its branch left at the base, notes.md says `cancelled` for it, and the server saw its answer hung up on
    (closed by the client, not read to its end) by `hung_up_by` (time.time()); no connection is left open."""
    cancelled = {e["task"]: e for e in logged if e["event"] == "iteration_cancelled"}
    assert sorted(cancelled) == sorted(cut), cancelled
    assert all(e["why"] == why and e["tokens"] > 0 for e in cancelled.values()), cancelled
    base = git(config.parent / "repo", "rev-parse", "HEAD")
    for name in cut:
        assert git(config.parent / "state" / "worktrees" / name, "status", "--porcelain", "--ignored") == "", name
        assert git(config.parent / "repo", "rev-parse", f"overnight/{name}") == base, name
    entries = NotesBook(config.parent / "state" / "notes.md").entries()
    assert sorted(entry.task for entry in entries if entry.reason == "cancelled") == sorted(cut)
    assert len(server.hang_ups) == len(cut) and max(server.hang_ups) <= hung_up_by, (server.hang_ups, hung_up_by)
    assert server.open_connections == 0


class TestANightEndedWhileEveryAnswerStreams:
    def test_sigterm_cuts_every_stream_rolls_every_task_back_and_exits_143(self, tmp_path, repo, capsys):
        """SIGTERM while four answers stream through litellm: exit 143 within seconds (not after the two minutes the
        streams would take), every iteration `cancelled` for SIGTERM with its tokens counted and rolled back, the run
        `cancelled`, the night's log all JSON with nothing left open, and every answer hung up on by the client."""
        answer, streamed = streaming_answers(seconds=120)
        with ScriptedServer(responder=answer) as server:
            process, config = start_night(tmp_path, server, swaps={})
            wait_until_every_task_streams(process, config, streamed)
            process.send_signal(signal.SIGTERM)
            signalled = time.time()
            stderr = ended_within(process, 30)
            assert process.returncode == 143, stderr[-3000:]
            assert_nothing_left_open(stderr)
            logged = events(stderr)
            assert [(e["why"], e["exit_code"]) for e in logged if e["event"] == "night_cancelled"] == [("SIGTERM", 143)]
            assert_cut_and_rolled_back(config, server, logged, TASK_NAMES, "SIGTERM", hung_up_by=signalled + 30)
        morning = report_json(config, capsys)
        assert (morning["run"]["status"], morning["run"]["exit_code"]) == ("cancelled", 143)
        assert [(task["outcome"], task["reason"], [it["outcome"] for it in task["iterations"]]) for task in morning["tasks"]] == [
            ("cancelled", "SIGTERM", ["cancelled"])
        ] * 4

    def test_the_deadline_cuts_every_running_task_within_seconds(self, tmp_path, repo, capsys):
        """The `[night] deadline` comes while four answers stream through litellm: the night ends within seconds (exit
        1, `finished`, stopped early by the deadline), every task `cancelled` for the deadline and rolled back, its
        tokens counted, nothing left open, every answer hung up on by the client."""
        answer, streamed = streaming_answers(seconds=120)
        jump = tmp_path / "deadline-now"
        with ScriptedServer(responder=answer) as server:
            process, config = start_night(tmp_path, server, swaps={"jump_at": str(jump)}, deadline="06:30")
            wait_until_every_task_streams(process, config, streamed)
            jump.touch()  # the night's clock reads 06:31 from now on
            due = time.time()
            stderr = ended_within(process, 30)
            assert process.returncode == 1, stderr[-3000:]
            assert_nothing_left_open(stderr)
            logged = events(stderr)
            assert [(e["exit_code"], e["stopped_early"]) for e in logged if e["event"] == "night_finished"] == [(1, "deadline")]
            assert_cut_and_rolled_back(config, server, logged, TASK_NAMES, "deadline", hung_up_by=due + 30)
        morning = report_json(config, capsys)
        assert (morning["run"]["status"], morning["run"]["exit_code"]) == ("finished", 1)
        assert [(task["outcome"], task["reason"], [it["outcome"] for it in task["iterations"]]) for task in morning["tasks"]] == [
            ("cancelled", "deadline", ["cancelled"])
        ] * 4

    def test_a_lost_lease_cuts_that_tasks_stream_alone(self, tmp_path, repo, capsys):
        """Another worker takes one task's lease while four answers stream through litellm: that task's answer is cut
        within seconds of the heartbeat seeing it (`lease_lost`, its tokens counted), rolled back, nothing committed;
        the other three read theirs to the end and fail their checks as scripted; nothing is left open."""
        # t0 streams on until it is cut; the others' answers end a few seconds after the loss, and the night with them.
        answer, streamed = streaming_answers(seconds=8, t0_seconds=120)
        with ScriptedServer(responder=answer) as server:
            process, config = start_night(tmp_path, server, swaps={"lease_ttl_s": 0.6})
            wait_until_every_task_streams(process, config, streamed)
            with contextlib.closing(sqlite3.connect(tmp_path / "state" / "runs.db", timeout=10)) as db, db:
                taken = db.execute("UPDATE leases SET owner = 'elsewhere:1:x:other' WHERE task = 't0'").rowcount
            assert taken == 1
            stderr = ended_within(process, 60)
            assert process.returncode == 1, stderr[-3000:]
            assert_nothing_left_open(stderr)
            logged = events(stderr)
            [lost] = [e for e in logged if e["event"] == "lease_lost"]
            [cut] = [e for e in logged if e["event"] == "iteration_cancelled"]
            assert lost["task"] == "t0" and seconds_between(at(lost), at(cut)) < 3.0
            # Hung up on as it was cut, while the others' answers streamed on: not at the night's end.
            first_other_end = min(at(e).timestamp() for e in logged if e["event"] == "iteration_rolled_back" and e["task"] != "t0")
            assert_cut_and_rolled_back(config, server, logged, ["t0"], "lease_lost", hung_up_by=first_other_end)
            assert len(streamed) == len(TASKS)  # the others' answers were read to their end, not asked again
        morning = report_json(config, capsys)
        assert [(task["name"], task["outcome"], task["reason"]) for task in morning["tasks"]] == [
            ("t0", "cancelled", "lease_lost"), *[(name, "failed", "check_failed") for name in TASK_NAMES[1:]]
        ]
