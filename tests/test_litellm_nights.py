"""Whole nights through the litellm transport at concurrency 4, and a script that calls the transport itself: nothing
left open (no `unclosed` socket, transport or event loop), and the server's connections bounded by the tasks' clients."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from orchestrator.fake_server import ScriptedServer
from orchestrator.scripted import Reply, call
from tests.conftest import write_config

TASKS = [{"name": f"t{n}", "prompt": "p", "check": "false", "tools": ["read_file", "submit"]} for n in range(4)]
# A task's own client: its first call asked ahead and its first turn may overlap (two connections), and a connection the
# server dropped is made again; more than this many a task is a client made per call, or one nobody closed.
CONNECTIONS_A_TASK = 3


def litellm_night(folder: Path, server: ScriptedServer, **model: Any) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`overnight run --log-format json` at concurrency 4 through litellm, Python's ResourceWarnings shown."""
    config = write_config(
        folder / "overnight.toml", api_base=server.url, repo=folder / "repo", tasks=TASKS,
        model={"transport": "litellm", "request_timeout_s": 10, **model}, night={"concurrency": 4, "max_iterations": 2},
    )
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--log-format", "json"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300,
        env={**os.environ, "NO_COLOR": "1", "PYTHONWARNINGS": "default"},
    )
    return done, config


def outcomes(config: Path) -> list[tuple[str, str | None]]:
    report = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "report", "--config", str(config), "--json"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120, check=True,
    )
    return sorted((task["outcome"], task["reason"]) for task in json.loads(report.stdout)["tasks"])


def assert_nothing_left_open(stderr: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert all(line.startswith("{") for line in lines), [line for line in lines if not line.startswith("{")]
    warned = [json.loads(line) for line in lines if '"python_warning"' in line]
    assert warned == [], warned
    assert "unclosed" not in stderr and "ResourceWarning" not in stderr


def assert_every_check_failed_as_scripted(folder: Path, script: list[Any], requests: int, **model: Any) -> None:
    """A night of the four tasks against `script`: exit 1, `requests` asked, at most a few connections a task (one
    client each), nothing left open, and every task's check failed as scripted."""
    with ScriptedServer(script) as server:
        done, config = litellm_night(folder, server, **model)
        assert done.returncode == 1, done.stderr
        assert len(server.requests) == requests
        assert 1 <= server.connections_opened <= CONNECTIONS_A_TASK * len(TASKS), server.connections_opened
    assert_nothing_left_open(done.stderr)
    assert outcomes(config) == [("failed", "check_failed")] * 4


class TestANightAtConcurrencyFour:
    def test_every_task_ends_as_scripted_and_leaves_no_connection_open(self, tmp_path, repo):
        """Four tasks at once through litellm, two iterations each: each fails its check as scripted, the night's log
        stays JSON with no `unclosed` warning, and the server saw at most a few connections a task (one client each)."""
        assert_every_check_failed_as_scripted(tmp_path, [call("submit", {"summary": "x"}, delay_s=0.2)] * 8, requests=8)

    def test_first_calls_answered_503_are_retried_and_the_night_goes_on(self, tmp_path, repo):
        """The four tasks' first calls all answered 503 at once: each is retried, the tasks end as scripted, and the error
        answers' kept-alive connections are closed with their tasks' clients, not left to the collector at exit."""
        script = [Reply(status=503)] * 4 + [call("submit", {"summary": "x"}, delay_s=0.2)] * 8
        # Four 503s in all, whichever tasks draw them: four retries leave even a task that draws all four an answer
        # (with two, one task's quick retries could meet all the 503s and pause it).
        assert_every_check_failed_as_scripted(tmp_path, script, requests=12, retries=4, retry_backoff_s=0)

    def test_a_server_that_answers_only_503_pauses_every_task(self, tmp_path, repo):
        """Only 503s at concurrency 4: every task is paused (model unreachable, exit 3), and nothing is left open."""
        with ScriptedServer([Reply(status=503)] * 40) as server:
            done, config = litellm_night(tmp_path, server, retries=1, retry_backoff_s=0)
            assert done.returncode == 3, done.stderr
            assert server.connections_opened <= CONNECTIONS_A_TASK * len(TASKS), server.connections_opened
        assert_nothing_left_open(done.stderr)
        assert {outcome for outcome in outcomes(config)} == {("paused", "model_unreachable")}


SCRIPT_ON_THE_MAIN_THREAD = textwrap.dedent("""
    from orchestrator.config import ModelConfig
    from orchestrator.fake_server import ScriptedServer
    from orchestrator.litellm_transport import LiteLLMTransport
    from orchestrator.scripted import say

    with ScriptedServer([say("hi")] * 2) as server:
        config = ModelConfig(name="openai/scripted", api_base=server.url, request_timeout_s=10, retries=0, transport="litellm")
        transport = LiteLLMTransport(config)
        for stream in (False, True):
            answer = transport.send({"model": config.name, "messages": [{"role": "user", "content": "x"}], "stream": stream}, stream=stream)
            list(answer) if stream else answer
        transport.close()
    print("done")
""")


def test_a_script_calling_the_transport_on_its_main_thread_exits_without_an_unclosed_event_loop(tmp_path):
    """litellm's call timing took `asyncio.get_event_loop()` on the main thread, which made a loop it never closed, and
    its exit hook set another in its place: `ResourceWarning: unclosed event loop` at a script's exit."""
    script = tmp_path / "call_litellm.py"
    script.write_text(SCRIPT_ON_THE_MAIN_THREAD)
    done = subprocess.run(
        [sys.executable, "-W", "default", str(script)], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr
    assert "unclosed" not in done.stderr and "ResourceWarning" not in done.stderr, done.stderr


SCRIPT_WITH_ITS_OWN_LOOP = textwrap.dedent("""
    import asyncio
    import atexit

    from orchestrator.config import ModelConfig
    from orchestrator.fake_server import ScriptedServer
    from orchestrator.litellm_transport import LiteLLMTransport
    from orchestrator.scripted import say

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)

    def flush_at_exit():
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
        print("flushed")

    atexit.register(flush_at_exit)
    with ScriptedServer([say("hi")]) as server:
        config = ModelConfig(name="openai/scripted", api_base=server.url, request_timeout_s=10, retries=0, transport="litellm")
        transport = LiteLLMTransport(config)
        transport.send({"model": config.name, "messages": [{"role": "user", "content": "x"}], "stream": False}, stream=False)
        transport.close()
    print("done")
""")


def test_a_scripts_own_event_loop_is_left_to_the_script_at_exit(tmp_path):
    """Only a loop litellm made during our call is closed at exit: a loop the script set itself, still used by its own
    exit hook, is not closed under it (`RuntimeError: Event loop is closed` in an atexit callback)."""
    script = tmp_path / "own_loop.py"
    script.write_text(SCRIPT_WITH_ITS_OWN_LOOP)
    done = subprocess.run(
        [sys.executable, "-W", "default", str(script)], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert done.returncode == 0 and done.stdout.split() == ["done", "flushed"], done.stderr
    assert "Traceback" not in done.stderr and "unclosed" not in done.stderr, done.stderr
