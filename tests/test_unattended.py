"""Nobody watches a night: signals, deadlines, budgets, a flaky server, tasks in parallel."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from orchestrator.build import night_parts
from orchestrator.config import load_config
from orchestrator.night import run_night
from orchestrator.notes import NotesBook
from orchestrator.scripted import Reply, call
from orchestrator.worktree import Worktree
from tests.conftest import git, many_slow_files, sighup_at_its_default, smudges_running, write_config
from tests.test_night import FIX, notes_text, overnight, report_json, worktree

EDIT_THEN_WAIT = [
    call("write_file", {"path": "scratch.txt", "content": "half-done"}),
    Reply(text="thinking", delay_s=30),
]


def slow_checkout(repo: Path, smudge: str) -> None:
    """greet.py checked out through a filter whose smudge runs `smudge` first (a slow git-lfs, say), committed."""
    git(repo, "config", "filter.slow.clean", "cat")
    git(repo, "config", "filter.slow.smudge", f"{smudge}; cat")
    (repo / ".gitattributes").write_text("greet.py filter=slow\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "slow checkout of greet.py")


def clock_from(moment: datetime, speed: float = 1.0):
    """A clock that reads `moment` when the night first asks, then runs at `speed` times real time."""
    first: list[float] = []

    def now() -> datetime:
        if not first:
            first.append(time.monotonic())
        return moment + timedelta(seconds=speed * (time.monotonic() - first[0]))

    return now


def run_in_process(config_path: Path, **replace: object):
    """A night through the same objects the CLI builds, with some parts swapped (clock)."""
    config = load_config(config_path)
    with night_parts(config) as parts:
        return run_night(dataclasses.replace(parts, **replace))


# `overnight <command> ...` in this process, sent SIGTERM the moment function argv[2] of module argv[1] is
# called (argv[3:] is the command line): a window too short to hit from outside.
SIGNAL_AS_IT_BEGINS = """
import importlib, os, signal, sys
module, function, words = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.argv = ["overnight", *words]
import orchestrator.cli as cli
target = getattr(importlib.import_module(module), function).__code__
def hook(frame, event, arg):
    if event == "call" and frame.f_code is target:
        sys.setprofile(None)
        os.kill(os.getpid(), signal.SIGTERM)
sys.setprofile(hook)
cli.entry()
"""


def _caught_signals(pid: int) -> set[int]:
    """The signals process `pid` has a handler for, from /proc ({} once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return set()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return {number for number in range(1, 65) if mask >> (number - 1) & 1}


def sigterm_once_the_agent_wrote(config: Path) -> tuple[subprocess.Popen, str]:
    """`overnight run` as a subprocess, sent SIGTERM once its agent wrote scratch.txt (EDIT_THEN_WAIT); its stderr."""
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    scratch = worktree(config) / "scratch.txt"
    deadline = time.monotonic() + 60
    while not scratch.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    assert scratch.exists(), process.communicate()[1]
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    return process, stderr


class TestCancellation:
    def test_sigterm_rolls_back_and_exits_143(self, config_file, server, capsys):
        """SIGTERM mid-iteration: exit 143, worktree back at its checkpoint, note says cancelled, no blame."""
        config = config_file(model={"request_timeout_s": 60})
        server.enqueue(*EDIT_THEN_WAIT)
        process, stderr = sigterm_once_the_agent_wrote(config)
        assert process.returncode == 143, stderr
        assert "Traceback" not in stderr
        assert git(worktree(config), "status", "--porcelain", "--ignored") == ""
        [entry] = NotesBook(config.parent / "state" / "notes.md").entries()
        assert entry.reason == "cancelled" and "not because of the model" in entry.text
        report = report_json(config, capsys)
        assert report["run"]["status"] == "cancelled" and report["run"]["exit_code"] == 143
        iteration = report["tasks"][0]["iterations"][0]
        assert iteration["outcome"] == "cancelled"
        assert not [s for s in iteration["signals"] if s["level"] == "severe"]
        # stderr is a pipe, so JSON lines (no --log-format): the log names the cancel, as reference.md says.
        events = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
        assert [(e["task"], e["iteration"], e["why"]) for e in events if e["event"] == "iteration_cancelled"] == [("fix-greet", 1, "SIGTERM")]
        assert [(e["why"], e["exit_code"]) for e in events if e["event"] == "night_cancelled"] == [("SIGTERM", 143)]


    def test_sigterm_after_a_task_was_paused_still_exits_143(self, config_file, server, capsys):
        """A signal's code wins over 3: the first task paused (model unreachable), then SIGTERM during the
        second's iteration. A service manager reads 143 as "stopped", and 3 would have it retry."""
        tasks = [
            {"name": "unlucky", "prompt": "p", "check": "python check_greet.py"},
            {"name": "fix-greet", "prompt": "p", "check": "python check_greet.py"},
        ]
        config = config_file(tasks=tasks, night={"concurrency": 1}, model={"retries": 1, "request_timeout_s": 60})
        server.enqueue(*[Reply(status=503)] * 2, *EDIT_THEN_WAIT)
        process, stderr = sigterm_once_the_agent_wrote(config)
        assert process.returncode == 143, stderr
        report = report_json(config, capsys)
        assert (report["run"]["status"], report["run"]["exit_code"]) == ("cancelled", 143)
        assert [(task["outcome"], task["reason"]) for task in report["tasks"]] == [("paused", "model_unreachable"), ("cancelled", "SIGTERM")]

    def test_sigterm_while_the_night_starts_up_ends_it_as_cancelled_with_143(self, config_file, server, capsys):
        """Start-up (imports, config, the lock, the store and the model) takes seconds: a SIGTERM then
        does not kill the process half way; the night begins cancelled, says so, and exits 143."""
        config = config_file()
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        lock = config.parent / "state" / "overnight.lock"
        deadline = time.monotonic() + 60
        while not lock.exists() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.005)
        process.send_signal(signal.SIGTERM)  # the lock is taken: the store and the model are being opened
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 143, stderr
        assert "Traceback" not in stderr
        report = report_json(config, capsys)
        assert report["run"]["status"] == "cancelled" and report["run"]["exit_code"] == 143
        assert [(task["outcome"], task["reason"]) for task in report["tasks"]] == [("cancelled", "SIGTERM")]

    def test_a_second_ctrl_c_stops_at_once_without_waiting_for_the_rollback(self, config_file, server, repo, tmp_path, capsys):
        """The rollback is slow (a smudge filter, as git-lfs fetching from a slow server): a second Ctrl-C
        exits 130 now, and the next night's recovery rolls back what was left in flight."""
        marker = tmp_path / "slow-now"
        slow_checkout(repo, f"test -e {marker} && sleep 8")
        config = config_file(model={"request_timeout_s": 60})
        server.enqueue(call("write_file", {"path": "greet.py", "content": "half done\n"}), Reply(text="thinking", delay_s=30))
        # ResourceWarning shown (Python ignores it by default): an unclosed client would be logged as `python_warning`.
        process = subprocess.Popen(
            [sys.executable, "-W", "default::ResourceWarning", "-m", "orchestrator.cli", "run", "--config", str(config), "--log-format", "json"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        edited = worktree(config) / "greet.py"
        deadline = time.monotonic() + 60
        while not (edited.exists() and edited.read_text() == "half done\n") and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        marker.touch()
        process.send_signal(signal.SIGINT)  # the rollback begins, and waits on the filter
        time.sleep(1.0)
        process.send_signal(signal.SIGINT)
        second = time.monotonic()
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 130, stderr
        assert time.monotonic() - second < 4, "the second Ctrl-C waited for the rollback"
        assert "night_abandoned" in stderr and "Traceback" not in stderr
        # The abandoned task's model client, its call hung, is not closed, and need not be: the exit is os._exit's, which
        # runs no finalizer, so no `unclosed` ResourceWarning (`python_warning`) is logged; the kernel closes its socket.
        assert "python_warning" not in stderr and "unclosed" not in stderr
        # Logged while the night's run exists, it names the run as every such event does (reference.md, "Log events").
        [abandoned] = [json.loads(line) for line in stderr.splitlines() if '"night_abandoned"' in line]
        assert abandoned["run_id"] == 1 and abandoned["exit_code"] == 130
        marker.unlink()
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        assert git(worktree(config), "show", "HEAD:greet.py").count("'hello'") == 1
        import sqlite3

        with sqlite3.connect(config.parent / "state" / "runs.db") as db:
            assert db.execute("SELECT status FROM runs ORDER BY id").fetchall() == [("crashed",), ("finished",)]
            assert db.execute("SELECT outcome FROM iterations ORDER BY id LIMIT 1").fetchall() == [("interrupted",)]

    def test_a_second_ctrl_c_still_tells_the_commits_kept_for_a_task_that_never_began(self, config_file, server, repo, tmp_path):
        """The next task's worktree, made ahead, kept a person's commits off its detached HEAD: a second Ctrl-C
        before that task begins still logs `worktree_commits_kept`, on the night's log, naming the task."""
        marker = tmp_path / "slow-now"
        slow_checkout(repo, f"test -e {marker} && sleep 8")
        other = {"name": "other", "prompt": "Say hello.", "check": "true"}
        fix_greet = {"name": "fix-greet", "prompt": "greet() should return 'hello'.", "check": "python check_greet.py"}
        config = config_file(model={"request_timeout_s": 60}, tasks=[fix_greet, other])
        settings = load_config(config)
        made = Worktree.ensure(repo, settings.state_dir, "other", settings.repo.base)
        git(made.path, "checkout", "-q", "--detach")
        (made.path / "review.txt").write_text("a reviewer's note\n")
        git(made.path, "add", "review.txt")
        git(made.path, "commit", "-q", "-m", "a reviewer's commit")
        server.enqueue(call("write_file", {"path": "greet.py", "content": "half done\n"}), Reply(text="thinking", delay_s=30))
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--log-format", "json"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        edited = worktree(config) / "greet.py"

        def ready() -> bool:  # fix-greet mid-iteration, and other's worktree made ahead, back on its branch
            on_branch = subprocess.run(["git", "-C", str(made.path), "symbolic-ref", "-q", "HEAD"], capture_output=True, text=True)
            return edited.exists() and edited.read_text() == "half done\n" and on_branch.stdout.strip() == "refs/heads/overnight/other"

        deadline = time.monotonic() + 60
        while not ready() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        marker.touch()
        process.send_signal(signal.SIGINT)  # the rollback begins, and waits on the filter
        time.sleep(1.0)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 130 and "night_abandoned" in stderr, stderr
        [kept] = [json.loads(line) for line in stderr.splitlines() if '"worktree_commits_kept"' in line]
        assert kept["task"] == "other" and kept["branch"].startswith("overnight-kept/other/") and kept["run_id"] == 1
        assert "task_run_id" not in kept
        assert git(repo, "log", "-1", "--format=%s", kept["branch"]).strip() == "a reviewer's commit"

    def test_a_second_ctrl_c_after_the_night_has_ended_still_exits_130(self, config_file, server, capsys):
        """Once the night is over (`night_cancelled` logged, the JUnit file written) the interpreter's
        teardown still takes a moment: a second Ctrl-C then was a KeyboardInterrupt in Python's
        shutdown, the process dead of SIGINT (-2 to its parent), not the 130 the night had decided."""
        config = config_file(model={"request_timeout_s": 60})
        server.enqueue(Reply(text="thinking", delay_s=30))
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--log-format", "json"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        deadline = time.monotonic() + 60
        while len(server.requests) < 1 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.02)
        process.send_signal(signal.SIGINT)
        # The state dir's lock is the last thing the command lets go of: free, the night is over.
        lock = os.open(config.parent / "state" / "overnight.lock", os.O_RDWR)
        try:
            while time.monotonic() < deadline and process.poll() is None:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    time.sleep(0.005)
                    continue
                fcntl.flock(lock, fcntl.LOCK_UN)
                break
        finally:
            os.close(lock)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 130, stderr
        assert '"night_cancelled"' in stderr and "Traceback" not in stderr and "night_abandoned" not in stderr

    def test_ctrl_c_pressed_all_through_the_teardown_changes_nothing(self, config_file, server, tmp_path):
        """A person who keeps pressing Ctrl-C while the process leaves: from the JUnit file on (the night's
        ending decided and published) to the process's end, each press lands in the teardown somewhere."""
        config = config_file(model={"request_timeout_s": 60})
        server.enqueue(Reply(text="thinking", delay_s=30))
        junit, errors = tmp_path / "night.xml", tmp_path / "stderr.txt"
        with errors.open("w") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--log-format", "json", "--junit", str(junit)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
            )
        deadline = time.monotonic() + 60
        while len(server.requests) < 1 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.02)
        process.send_signal(signal.SIGINT)
        while not junit.exists() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.001)
        presses = 0
        while process.poll() is None and time.monotonic() < deadline:
            process.send_signal(signal.SIGINT)
            presses += 1
            time.sleep(0.002)
        assert process.wait(timeout=30) == 130, errors.read_text()
        text = errors.read_text()
        assert presses > 0 and '"night_cancelled"' in text
        assert "Traceback" not in text and "night_abandoned" not in text and "KeyboardInterrupt" not in text

    def test_a_report_written_into_a_pipe_nobody_reads_does_not_hold_the_state_dir(self, config_file, server, tmp_path):
        """`--junit` writes into a pipe; one nobody reads holds the writer. Once the night is recorded, the
        first signal changes nothing and the second ends the process with its code, the lock let go."""
        config = config_file()
        server.enqueue(*FIX)
        junit, errors = tmp_path / "junit.pipe", tmp_path / "stderr.txt"
        os.mkfifo(junit)
        with errors.open("w") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--log-format", "json", "--junit", str(junit)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
            )
        try:
            deadline = time.monotonic() + 60
            while '"night_finished"' not in errors.read_text() and time.monotonic() < deadline and process.poll() is None:
                time.sleep(0.05)
            time.sleep(0.5)
            assert process.poll() is None, errors.read_text()  # held by the pipe
            process.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            assert process.poll() is None  # the first changes nothing
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=10) == 143
        finally:
            process.kill()
            process.wait()
        assert "Traceback" not in errors.read_text()
        lock = os.open(config.parent / "state" / "overnight.lock", os.O_RDWR)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(lock)

    @pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
    def test_a_signal_while_the_command_is_still_starting_exits_with_its_code(self, config_file, server, signum, code):
        """The command's own imports take half a second on a slow host, before any handler of the night's: a
        SIGTERM there was a death by signal (-15), a Ctrl-C a KeyboardInterrupt traceback from inside an import
        (serve passing a signal on to a night it has just started meets that window too). Sent as soon as
        the process catches SIGTERM (Python itself does not), while it has yet to load pydantic's core."""
        config = config_file(model={"request_timeout_s": 60})
        server.enqueue(Reply(text="thinking", delay_s=30))
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--log-format", "json"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            # As at a terminal: a test run started in the background (`&`) has SIGINT ignored, and kept so.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        deadline = time.monotonic() + 60
        while signal.SIGTERM not in _caught_signals(process.pid) and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.001)
        still_importing = "pydantic_core" not in Path(f"/proc/{process.pid}/maps").read_text()
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == code, stderr
        assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
        assert still_importing  # the window this is about, not the night's own handlers

    def test_a_signal_as_run_begins_exits_with_its_code_having_made_nothing(self, config_file):
        """Sent the moment typer calls `run`, before its first line: `main` had put the usual handlers back
        already, so SIGTERM there was a death by signal (-15) instead of 143."""
        config = config_file()
        done = subprocess.run(
            [sys.executable, "-c", SIGNAL_AS_IT_BEGINS, "orchestrator.cli", "run", "run", "--config", str(config), "--log-format", "json"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 143, done.stderr
        assert "Traceback" not in done.stderr and not (config.parent / "state").exists()

    def test_a_signal_its_parent_ignores_stays_ignored(self, tmp_path):
        """`sh` starts `overnight gc &` with SIGINT ignored: the early handler, and then main's usual ones, made a
        Ctrl-C meant for the script stop the command (a gc half done)."""
        script = (
            "import os, signal, sys, time\n"
            "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "sys.argv = ['overnight', 'notes', '--config', sys.argv[1]]\n"
            "import orchestrator.cli as cli\n"
            "os.kill(os.getpid(), signal.SIGINT); time.sleep(0.2)\n"
            "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
            "print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)\n"
        )
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "missing.toml")], capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout.strip()) == (0, "True"), done.stderr

    def test_sigterm_to_the_whole_service_while_the_check_runs_is_cancelled_not_check_failed(self, config_file, server, capsys):
        """systemd's control-group kill signals the check too; dying of it first is no failed check, no blame."""
        tasks = [{"name": "fix-greet", "prompt": "p", "check": "echo $$ > check.pid; sleep 10; python check_greet.py"}]
        config = config_file(tasks=tasks)
        server.enqueue(*FIX[:3], FIX[4])  # no run_check: the pid file is the task check's
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        pid_file = worktree(config) / "check.pid"
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        # The check dies first, and the night's own handler runs a moment later: the worst order.
        os.killpg(int(pid_file.read_text()), signal.SIGTERM)
        time.sleep(0.3)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 143, stderr
        [entry] = NotesBook(config.parent / "state" / "notes.md").entries()
        assert entry.reason == "cancelled"
        iteration = report_json(config, capsys)["tasks"][0]["iterations"][0]
        assert iteration["outcome"] == "cancelled" and not [s for s in iteration["signals"] if s["level"] == "severe"]


    def test_sigterm_to_the_whole_service_while_worktrees_are_checked_out_is_cancelled_not_crashed(self, config_file, server, repo, tmp_path, capsys):
        """systemd's control-group kill while the night checks out its tasks' worktrees (seconds each on a large
        repository's first night): git died of the SIGTERM a moment before the night's handler ran, and that
        was "cannot check out the files", exit 2, the run `crashed`. Now the tasks are cancelled, exit 143,
        and the next night checks the worktrees out and works."""
        smudges = tmp_path / "smudge.pids"
        slow_checkout(repo, f"echo $$ >> {smudges}; sleep 10")
        tasks = [{"name": name, "prompt": "p", "check": "python check_greet.py"} for name in ("fix-greet", "also")]
        config = config_file(tasks=tasks, night={"concurrency": 2}, model={"request_timeout_s": 60})
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        deadline = time.monotonic() + 60
        while len(smudges.read_text().split() if smudges.exists() else ()) < 2 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        # Both checkouts under way, each git in its own process group: the service's kill reaches them first.
        for pid in smudges.read_text().split():
            os.killpg(os.getpgid(int(pid)), signal.SIGTERM)
        time.sleep(0.3)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 143, stderr
        report = report_json(config, capsys)
        assert (report["run"]["status"], report["run"]["exit_code"]) == ("cancelled", 143)
        assert [(task["outcome"], task["reason"], task["iterations"]) for task in report["tasks"]] == [("cancelled", "SIGTERM", [])] * 2
        git(repo, "config", "filter.slow.smudge", "cat")
        config = config_file(tasks=tasks, night={"concurrency": 1})  # one at a time: each takes its FIX from the queue whole
        server.enqueue(*FIX, *FIX)
        assert overnight("run", "--config", str(config)) == 0
        assert all(git(worktree(config, name), "status", "--porcelain") == "" for name in ("fix-greet", "also"))

    def test_sigterm_while_a_worktree_is_checked_out_stops_its_git_and_the_next_night_works(self, config_file, server, repo, tmp_path, capsys):
        """A large repository's first checkout took a minute, and a SIGTERM waited for all of it (cron and systemd
        kill a stopped job after ~90 s): its git is now killed with its filters, exit 143 at once, the task cancelled
        (nobody blamed), and the next night checks the worktree out whole and works."""
        smudges = tmp_path / "smudge.pids"
        count = 600
        many_slow_files(repo, count, f"echo $$ >> {smudges}; sleep 0.1")  # a minute to check out, whole
        config = config_file(model={"request_timeout_s": 60})
        server.enqueue(Reply(text="thinking", delay_s=30))  # the first request, asked ahead while the checkout runs
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        checked_out = worktree(config) / "data"
        deadline = time.monotonic() + 60
        while len(list(checked_out.iterdir()) if checked_out.is_dir() else ()) < 5 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)  # a handful of files out of 600 checked out
        try:
            # The checkout left takes a minute at the least (595 files, 0.1 s each, however fast the machine): 40 s
            # leave a slow, loaded machine its Python's exit (7 s seen at a load of 5 on two CPUs) and still tell.
            _, stderr = process.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            pytest.fail("40 s after the SIGTERM, the night still waited for the checkout")
        finally:
            process.kill()
        assert process.returncode == 143, stderr
        assert len(list(checked_out.iterdir())) < count and "Traceback" not in stderr
        # Neither git nor the filter it ran is left writing into the worktree (the folder may sit in the repository).
        time.sleep(0.2)
        assert not smudges_running(smudges)
        report = report_json(config, capsys)
        assert (report["run"]["status"], report["run"]["exit_code"]) == ("cancelled", 143)
        assert [(task["outcome"], task["reason"], task["iterations"]) for task in report["tasks"]] == [("cancelled", "SIGTERM", [])]
        assert notes_text(config) == ""
        git(repo, "config", "--remove-section", "filter.slow")  # the next night's checkout at full speed
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        assert git(worktree(config), "status", "--porcelain") == ""
        assert len(list(checked_out.iterdir())) == count
        assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 2

    def test_sighup_of_a_closed_terminal_rolls_back_and_exits_129(self, config_file, server, capsys):
        """The terminal a night was started from goes away: SIGHUP, and every log line written after it fails."""
        import pty

        config = config_file(model={"request_timeout_s": 60})
        server.enqueue(*EDIT_THEN_WAIT)
        terminal, night_side = pty.openpty()
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config)],
            stdin=subprocess.DEVNULL, stdout=night_side, stderr=night_side, start_new_session=True,
            preexec_fn=sighup_at_its_default,
        )
        os.close(night_side)
        scratch = worktree(config) / "scratch.txt"
        deadline = time.monotonic() + 60
        while not scratch.exists() and time.monotonic() < deadline and process.poll() is None:
            _drain(terminal)
        assert scratch.exists()
        _drain(terminal)
        os.close(terminal)  # from here on, writing to the terminal fails (EIO)
        process.send_signal(signal.SIGHUP)
        assert process.wait(timeout=30) == 129
        assert git(worktree(config), "status", "--porcelain", "--ignored") == ""
        [entry] = NotesBook(config.parent / "state" / "notes.md").entries()
        assert entry.reason == "cancelled" and "SIGHUP" in entry.text
        report = report_json(config, capsys)
        assert report["run"]["status"] == "cancelled" and report["run"]["exit_code"] == 129
        assert report["tasks"][0]["outcome"] == "cancelled" and report["tasks"][0]["reason"] == "SIGHUP"

    def test_sighup_under_nohup_is_ignored(self, config_file, server, capsys):
        """Started with SIGHUP ignored (nohup), the night does not stop when the terminal goes."""
        config = config_file()
        server.enqueue(call("list_dir", {"path": "."}, delay_s=1.5), *FIX[1:])
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
        )
        time.sleep(0.8)
        process.send_signal(signal.SIGHUP)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 0, stderr
        assert report_json(config, capsys)["tasks"][0]["outcome"] == "succeeded"

    def test_a_second_signal_inside_the_first_handlers_cancel_does_not_deadlock(self):
        """Signal handlers run between two bytecodes of the main thread: a second one can land while the first holds the token's lock."""
        import threading

        from orchestrator.cancel import CancelToken

        token = CancelToken()
        done = threading.Event()

        def second_signal_inside_the_first() -> None:
            with token._lock:  # the first handler, inside cancel()
                token.cancel("SIGINT")
            done.set()

        threading.Thread(target=second_signal_inside_the_first, daemon=True).start()
        assert done.wait(2) and token.cancelled and token.why == "SIGINT"


def _drain(terminal: int) -> None:
    """Read what the night wrote to its terminal, so that it never blocks on a full one."""
    import select

    if select.select([terminal], [], [], 0.05)[0]:
        try:
            os.read(terminal, 65536)
        except OSError:
            pass


class TestSignalsAfterTheDeadline:
    """The deadline cancels the night's token too: a signal that comes while it winds the night down
    is still a first signal (no rollback abandoned) and names the exit code."""

    @pytest.fixture
    def signals(self):
        """The night's token, and the `night_over` its handlers were given with it."""
        from orchestrator.cancel import CancelToken
        from orchestrator.process_signals import cancel_on_signals

        saved = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        token = CancelToken()
        try:
            night_over = cancel_on_signals(token)
            yield token, night_over
        finally:
            for number, handler in saved.items():
                signal.signal(number, handler)

    @pytest.fixture
    def handlers(self, signals):
        return signals[0]

    def test_sigterm_while_the_deadline_winds_down_makes_the_night_a_sigterm_one(self, handlers):
        handlers.cancel("deadline")
        signal.raise_signal(signal.SIGTERM)
        assert handlers.why == "SIGTERM"
        signal.raise_signal(signal.SIGTERM)  # once more: nothing new
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # a second signal, from a person at the terminal: stop at once

    def test_a_first_ctrl_c_while_the_deadline_winds_down_abandons_nothing(self, handlers):
        handlers.cancel("deadline")
        signal.raise_signal(signal.SIGINT)
        assert handlers.why == "SIGINT"

    def test_a_tasks_token_follows_the_night_restated_by_a_signal(self, handlers):
        """A task's token (a child of the night's) reads as the night's does once a signal restates the deadline's stop:
        the night is recorded `cancelled`, 143, and what a task read from its token after that said `deadline`."""
        begun = handlers.child()
        handlers.cancel("deadline")
        begun_after_the_deadline = handlers.child()  # born cancelled: its reason is the night's too
        signal.raise_signal(signal.SIGTERM)
        tokens = (handlers, begun, begun_after_the_deadline, handlers.child())
        assert [token.why for token in tokens] == ["SIGTERM"] * 4

    def test_a_task_stopped_on_its_own_keeps_its_reason_when_the_night_is_restated(self, handlers):
        """A lost lease is that task's own stop: neither the deadline nor a later signal renames it."""
        lost = handlers.child()
        lost.cancel("lease_lost")
        handlers.cancel("deadline")
        signal.raise_signal(signal.SIGTERM)
        assert (handlers.why, lost.why) == ("SIGTERM", "lease_lost")

    def test_a_third_ctrl_c_while_the_second_abandons_the_night_raises_nothing(self, handlers):
        """The second's KeyboardInterrupt abandons the night (`stop_at_once`: a log line, then exit 130); a
        third landing in that log line escaped it, and the exit went on to the rollbacks' threads and a traceback."""
        signal.raise_signal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGTERM)
        assert handlers.why == "SIGINT"

    def test_once_the_night_is_over_a_second_ctrl_c_raises_nothing(self, signals):
        """Its KeyboardInterrupt would land wherever the teardown was, a finalizer included. (The next
        signal ends the process: see test_a_report_written_into_a_pipe_nobody_reads_does_not_hold_the_state_dir.)"""
        token, night_over = signals
        signal.raise_signal(signal.SIGINT)
        night_over()
        signal.raise_signal(signal.SIGINT)
        assert token.why == "SIGINT"


class TestTaskTokens:
    """Each task's token is a child of the night's, hooked to it while the task needs the night's stop."""

    def test_tasks_that_ended_leave_no_hook_on_the_nights_token(self, config_file, server):
        """A night of several tasks, each with its own model client listening to its token: once they have ended, the
        night's token holds none of them (`serve` runs many tasks a night; each held its closed client till the end)."""
        from orchestrator.cancel import CancelToken

        tasks = [{"name": f"t{i}", "prompt": "p", "check": "true", "tools": ["read_file", "submit"]} for i in range(3)]
        config = config_file(tasks=tasks, night={"concurrency": 2})
        server.enqueue(*[call("submit", {"summary": "done"})] * 3)
        nights_stop = CancelToken()
        result = run_in_process(config, cancel=nights_stop)
        assert [t.outcome.value for t in result.tasks] == ["succeeded"] * 3
        # Private (no public count): the night's own hook (the end of its waits), and no task's.
        assert len(nights_stop._hooks) == 1 and nights_stop._children == []

    def test_a_first_call_that_outlives_its_task_is_still_cut_by_the_nights_stop(self, config_file, server, repo):
        """A task skipped before its first turn (its branch checked out for review) leaves its first request
        streaming: its token stays hooked to the night's until that call ends, so a stop cuts it, then lets go."""
        from orchestrator.cancel import CancelToken

        git(repo, "checkout", "-q", "-b", "overnight/reviewed")  # a person reviews the branch in their checkout
        config = config_file(tasks=[{"name": "reviewed", "prompt": "p", "check": "true"}])
        server.enqueue(Reply(text="thinking", delay_s=30))
        nights_stop = CancelToken()
        [task] = run_in_process(config, cancel=nights_stop).tasks
        assert task.reason == "branch_checked_out"
        assert len(nights_stop._children) == 1, "the first call still out no longer hears the night's stop"
        started = time.monotonic()
        nights_stop.cancel("SIGTERM")
        deadline = time.monotonic() + 10
        while nights_stop._children and time.monotonic() < deadline:
            time.sleep(0.02)
        assert nights_stop._children == [] and time.monotonic() - started < 5


class TestLogReaderGone:
    def test_a_log_reader_that_goes_away_does_not_stop_the_night(self, config_file, server, capsys):
        """`overnight run | head -1`, a CI log collector that died: the night's logs are lost, not its work."""
        config = config_file()
        server.enqueue(call("list_dir", {"path": "."}, delay_s=1.0), *FIX[1:])
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--log-format", "json"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        while b"night_started" not in process.stderr.readline():
            assert process.poll() is None
        process.stderr.close()  # the reader is gone: every later write gets EPIPE
        assert process.wait(timeout=60) == 0
        [task] = report_json(config, capsys)["tasks"]
        assert task["outcome"] == "succeeded"
        assert NotesBook(config.parent / "state" / "notes.md").entries() == []

    @pytest.mark.parametrize("log_format", ["auto", "human"])
    def test_a_night_started_with_stderr_closed_runs_and_reports(self, config_file, server, capsys, tmp_path, log_format):
        """`overnight run 2>&-` (a daemon or a supervisor that starts it with its streams closed): Python's
        sys.stderr is None, and the first log line was an AttributeError. The night died at `night_started`,
        exit 1 ("a task failed"), its run left `running` and its JUnit file with no test case (an outside review)."""
        config = config_file()
        server.enqueue(*FIX)
        junit = tmp_path / "junit.xml"
        command = [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--log-format", log_format, "--junit", str(junit)]
        done = subprocess.run(["bash", "-c", 'exec "$@" 2>&-', "night", *command], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout
        [task] = report_json(config, capsys)["tasks"]
        assert task["outcome"] == "succeeded"
        assert '<testcase classname="overnight" name="fix-greet"' in junit.read_text()

    def test_signal_lines_with_stderr_closed_go_nowhere_not_onto_stdout(self, config_file, server, capsys):
        """`overnight run --log-format human 2>&-`: the guards' warning and stop lines were printed on stdout
        (print's fallback for a stream that is None), which a script may parse; they are dropped as the log's are."""
        config = config_file()
        server.enqueue(call("no_such_tool"), call("no_such_tool"), *FIX)
        command = [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--log-format", "human"]
        done = subprocess.run(["bash", "-c", 'exec "$@" 2>&-', "night", *command], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout
        assert done.stdout == ""
        [task] = report_json(config, capsys)["tasks"]
        assert [it["reason"] for it in task["iterations"]] == ["unknown_tool", None]


class TestDeadline:
    def test_deadline_cancels_the_iteration_in_flight(self, config_file, server, capsys):
        """At the deadline the running iteration is cancelled and rolled back; later tasks do not start."""
        tasks = [
            {"name": "first", "prompt": "p", "check": "python check_greet.py"},
            {"name": "second", "prompt": "p", "check": "python check_greet.py"},
        ]
        config = config_file(tasks=tasks, model={"request_timeout_s": 60}, night={"deadline": "06:30"})
        server.enqueue(*EDIT_THEN_WAIT)
        started = time.monotonic()
        result = run_in_process(config, now=clock_from(datetime(2026, 11, 30, 6, 29, 58, tzinfo=timezone.utc)))
        assert time.monotonic() - started < 20
        assert result.exit_code == 1
        first, second = result.tasks
        assert first.outcome.value == "cancelled" and first.reason == "deadline"
        assert second.outcome.value == "cancelled" and second.iterations == ()
        # The task that never started is in the morning's account too, cancelled by the deadline.
        recorded, never_started = report_json(config, capsys)["tasks"]
        assert [it["outcome"] for it in recorded["iterations"]] == ["cancelled"]
        assert (never_started["name"], never_started["outcome"], never_started["reason"]) == ("second", "cancelled", "deadline")
        assert never_started["iterations"] == []
        assert git(worktree(config, "first"), "status", "--porcelain", "--ignored") == ""
        assert "`cancelled`" in notes_text(config)
        capsys.readouterr()
        assert overnight("report", "--config", str(config)) == 0
        assert "    #1 cancelled · " in capsys.readouterr().out  # its reason, the same word, said once

    def test_a_scheduled_night_begun_again_after_its_deadline_starts_nothing(self, config_file, server):
        """The deadline is the first after the night's fire time: `serve` starting the 06:00 night again at
        06:45 (within the grace) ends it at once, every task `cancelled`/`deadline`, not tomorrow at 06:30."""
        config = config_file(night={"deadline": "06:30"})
        server.enqueue(*FIX)
        fired = datetime(2026, 11, 30, 6, 0, tzinfo=timezone.utc)
        result = run_in_process(config, scheduled_for=fired, now=clock_from(datetime(2026, 11, 30, 6, 45, tzinfo=timezone.utc)))
        assert result.exit_code == 1
        [task] = result.tasks
        assert (task.outcome.value, task.reason, task.iterations) == ("cancelled", "deadline", ())
        assert server.requests == []

    @pytest.mark.parametrize(
        ("fired", "now", "works"),
        [
            # Forward (02:00 CET is 03:00 CEST): at 06:45 summer time the deadline has passed; it was read as 07:30.
            ("2026-03-29T01:30:00+01:00", datetime(2026, 3, 29, 6, 45), False),
            # Back (03:00 CEST is 02:00 CET): at 05:45 winter time it is 45 minutes away; it was read as 05:30.
            ("2026-10-25T01:30:00+02:00", datetime(2026, 10, 25, 5, 45), True),
        ],
        ids=["forward", "back"],
    )
    def test_a_scheduled_nights_deadline_keeps_its_hour_on_the_night_the_clocks_change(self, config_file, server, fired, now, works):
        """`serve` names the fire time with its offset (`--scheduled-for 2026-03-29T01:30:00+01:00`), fixed: with
        `timezone = "local"` (the default) the deadline was read on that offset, an hour off once the host's
        clocks had changed. Read on the host's own clock (here Berlin's), 06:30 is 06:30 (found by a review)."""
        from zoneinfo import ZoneInfo

        config = config_file(night={"deadline": "06:30", "max_iterations": 1})
        server.enqueue(*FIX)
        result = run_in_process(
            config, scheduled_for=datetime.fromisoformat(fired), now=clock_from(now.replace(tzinfo=ZoneInfo("Europe/Berlin")))
        )
        [task] = result.tasks
        if works:
            assert task.outcome.value == "succeeded"
        else:
            assert (task.outcome.value, task.reason, task.iterations) == ("cancelled", "deadline", ())
            assert server.requests == []

    def test_no_iteration_starts_that_cannot_finish(self, config_file, server):
        """After an iteration that took longer than the time left, no further iteration starts."""
        config = config_file(night={"deadline": "06:30", "max_iterations": 3})
        server.enqueue(call("read_file", {"path": "greet.py"}, delay_s=1.5), call("submit", {"summary": "x"}))
        # The clock runs 5x fast: the ~2 s first iteration looks like ~10 s, all the time left.
        result = run_in_process(config, now=clock_from(datetime(2026, 11, 30, 6, 29, 50, tzinfo=timezone.utc), speed=5))
        [task] = result.tasks
        assert len(task.iterations) == 1 and task.outcome.value == "cancelled" and task.reason == "deadline"


    def test_a_scheduled_night_begun_again_judges_its_first_iteration_by_the_earlier_runs(self, config_file, server):
        """`serve` begins a night again (a restart): its first iteration was not judged against the deadline, as
        none of its own had been timed; at 06:20 a 40-minute one started, to be cancelled at 06:30. The slowest
        iteration of the fire's earlier runs (this state dir's) judges it: here a 3 s one, with 2 s left."""
        fired = datetime.now(timezone.utc) - timedelta(seconds=5)
        deadline = (fired + timedelta(hours=2)).strftime("%H:%M")
        tasks = [{"name": "slow", "prompt": "p", "check": "false"}]
        config = config_file(tasks=tasks, night={"deadline": deadline, "max_iterations": 1}, extra='\n[schedule]\ntimezone = "UTC"\n')
        server.enqueue(call("submit", {"summary": "x"}, delay_s=3))
        [slow] = run_in_process(config, scheduled_for=fired).tasks
        assert (slow.outcome.value, slow.reason) == ("failed", "check_failed")
        # Begun again with a task the first run never reached, 2 s before the deadline.
        tasks.append({"name": "fix-greet", "prompt": "p", "check": "python check_greet.py"})
        config = config_file(tasks=tasks, night={"deadline": deadline, "max_iterations": 1}, extra='\n[schedule]\ntimezone = "UTC"\n')
        server.enqueue(*FIX)
        asked = len(server.requests)
        at = datetime.fromisoformat(f"{(fired + timedelta(hours=2)).date()}T{deadline}:00+00:00")
        result = run_in_process(config, scheduled_for=fired, now=clock_from(at - timedelta(seconds=2)))
        _, fixed = result.tasks
        assert (fixed.outcome.value, fixed.reason, fixed.iterations) == ("cancelled", "deadline", ())
        assert len(server.requests) == asked

    def test_the_deadline_is_read_on_the_schedules_clock(self, config_file, server):
        """`[schedule] timezone` names a zone: "06:30" is 06:30 there, as the cron line's 01:30 is (a host on
        UTC serving another zone's night read it as UTC's, hours or a day away; found by a review)."""
        from zoneinfo import ZoneInfo

        config = config_file(night={"deadline": "06:30", "max_iterations": 3}, extra='\n[schedule]\ntimezone = "Pacific/Chatham"\n')
        server.enqueue(call("read_file", {"path": "greet.py"}, delay_s=1.5), call("submit", {"summary": "x"}))
        there = datetime(2026, 11, 30, 6, 29, 50, tzinfo=ZoneInfo("Pacific/Chatham"))
        result = run_in_process(config, now=clock_from(there.astimezone(timezone.utc), speed=5))
        [task] = result.tasks
        assert len(task.iterations) == 1 and (task.outcome.value, task.reason) == ("cancelled", "deadline")

    def test_the_first_iterations_time_counts_its_first_model_call(self, config_file, server, repo):
        """The first request leaves ahead, overlapping the task's set-up (here a 3 s checkout, as git-lfs
        makes one): the first iteration was timed from its start, most of its 4 s call uncounted, and a
        second began with 3 s left, to be cancelled at the deadline (found by a review). Timed from the
        request, the second is refused."""
        slow_checkout(repo, "sleep 3")
        config = config_file(night={"deadline": "06:30", "max_iterations": 3}, tasks=[{"name": "t", "prompt": "p", "check": "false"}])
        server.enqueue(call("submit", {"summary": "x"}, delay_s=4), call("submit", {"summary": "x"}, delay_s=4))
        result = run_in_process(config, now=clock_from(datetime(2026, 11, 30, 6, 29, 53, tzinfo=timezone.utc)))
        [task] = result.tasks
        assert (task.outcome.value, task.reason) == ("cancelled", "deadline")
        assert [(it.outcome.value, it.reason) for it in task.iterations] == [("rolled_back", "check_failed")]
        assert len(server.requests) == 1

    def test_a_task_too_slow_for_the_time_left_stops_only_itself(self, tmp_path, repo):
        """At concurrency 2, a slow task refused another iteration (too little time left for one
        like its last) does not cancel the other task's iteration, which still commits in time."""
        from collections import deque

        from orchestrator.fake_server import ScriptedServer

        # The clock runs 1200x: a second is 20 minutes. Start 05:30, deadline 06:30.
        replies = {
            "SLOW": deque([call("submit", {"summary": "x"}, delay_s=1.75)] * 3),  # 35 min, then the check fails
            "FIX": deque([call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}),
                          call("submit", {"summary": "fixed"}, delay_s=2.25)]),  # commits at about 06:15
        }

        def respond(body):
            asked = "\n".join(str(m.get("content")) for m in body["messages"] if m["role"] == "user")
            queue = replies["SLOW" if "SLOW" in asked else "FIX"]
            return queue.popleft() if queue else None

        tasks = [
            {"name": "slow", "prompt": "SLOW task", "check": "false", "tools": ["read_file", "submit"]},
            {"name": "fix", "prompt": "FIX task", "check": "python check_greet.py"},
        ]
        with ScriptedServer(responder=respond) as server:
            config = write_config(
                tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=tasks,
                model={"request_timeout_s": 30}, night={"deadline": "06:30", "concurrency": 2, "max_iterations": 3},
            )
            result = run_in_process(config, now=clock_from(datetime(2026, 11, 30, 5, 30, tzinfo=timezone.utc), speed=1200))
        slow, fixed = result.tasks
        assert (slow.outcome.value, slow.reason, len(slow.iterations)) == ("cancelled", "deadline", 1)
        assert fixed.outcome.value == "succeeded"

    def test_the_deadline_keeps_its_hour_when_the_clocks_change(self):
        """06:30 is 06:30 on the nights the clocks go forward and back, and elapsed time is real time."""
        from zoneinfo import ZoneInfo

        from orchestrator.cancel import deadline_after, seconds_between

        berlin = ZoneInfo("Europe/Berlin")
        spring = datetime(2025, 3, 30, 1, 30, tzinfo=berlin)  # 02:00 CET becomes 03:00 CEST
        autumn = datetime(2025, 10, 26, 1, 30, tzinfo=berlin)  # 03:00 CEST becomes 02:00 CET
        for start, hours in ((spring, 4), (autumn, 6)):
            deadline = deadline_after(start, "06:30")
            assert deadline.astimezone(berlin).strftime("%H:%M") == "06:30"
            assert seconds_between(start, deadline) == hours * 3600

    def test_a_deadline_in_the_hour_the_clocks_repeat_is_its_second_pass_not_tomorrows(self):
        """Started at 02:45 summer time on the night 03:00 becomes 02:00, "02:30" comes again 45 minutes
        later (winter time): it was taken for tomorrow's, a night of 24.75 hours (found by a review)."""
        from zoneinfo import ZoneInfo

        from orchestrator.cancel import deadline_after, seconds_between

        start = datetime(2025, 10, 26, 0, 45, tzinfo=timezone.utc).astimezone(ZoneInfo("Europe/Berlin"))
        assert seconds_between(start, deadline_after(start, "02:30")) == 45 * 60
        # Before the first pass, the first pass; after the second, tomorrow's.
        early = datetime(2025, 10, 26, 0, 15, tzinfo=timezone.utc).astimezone(ZoneInfo("Europe/Berlin"))
        assert seconds_between(early, deadline_after(early, "02:30")) == 15 * 60
        late = datetime(2025, 10, 26, 1, 45, tzinfo=timezone.utc).astimezone(ZoneInfo("Europe/Berlin"))
        assert seconds_between(late, deadline_after(late, "02:30")) == 24 * 3600 - 15 * 60

    def test_a_zone_given_as_a_posix_rule_keeps_its_daylight_saving(self):
        """TZ as a POSIX rule, which tzlocal cannot name: the deadline used this moment's offset, fixed,
        and on the night the clocks go forward 06:30 came at 07:30 (found by a review). In a process of
        its own: TZ is read at a process's start, and tzlocal keeps the zone it found first."""
        import subprocess
        import sys

        script = """
from datetime import datetime, timezone
from orchestrator.cancel import deadline_after, local_now, seconds_between
zone = local_now().tzinfo
assert abs(seconds_between(local_now(), datetime.now(timezone.utc))) < 5
spring = datetime(2025, 3, 30, 1, 30, tzinfo=zone)  # 02:00 CET becomes 03:00 CEST
autumn = datetime(2025, 10, 26, 1, 30, tzinfo=zone)  # 03:00 CEST becomes 02:00 CET
for start, hours, utc in ((spring, 4, "04:30"), (autumn, 6, "05:30")):
    deadline = deadline_after(start, "06:30")
    assert seconds_between(start, deadline) == hours * 3600, (start, deadline)
    assert deadline.astimezone(timezone.utc).strftime("%H:%M") == utc, deadline
# The hour the clocks repeat: each pass read as itself (an iteration across it was an hour off), and
# a deadline there is its second pass when the first has gone by.
before = datetime(2025, 10, 26, 0, 50, tzinfo=timezone.utc).astimezone(zone)
after = datetime(2025, 10, 26, 1, 10, tzinfo=timezone.utc).astimezone(zone)
assert (before.strftime("%H:%M"), after.strftime("%H:%M")) == ("02:50", "02:10"), (before, after)
assert seconds_between(before, after) == 20 * 60, (before, after)
second_pass = datetime(2025, 10, 26, 0, 45, tzinfo=timezone.utc).astimezone(zone)
assert seconds_between(second_pass, deadline_after(second_pass, "02:30")) == 45 * 60
# The hour the clocks skip: "02:30" at 01:45 CET is 45 minutes on (03:30 CEST), as a named zone reads
# it; it was read with summer time's offset, so before the start, and taken for tomorrow's.
skipped = datetime(2025, 3, 30, 0, 45, tzinfo=timezone.utc).astimezone(zone)
assert skipped.strftime("%H:%M") == "01:45", skipped
assert seconds_between(skipped, deadline_after(skipped, "02:30")) == 45 * 60, deadline_after(skipped, "02:30")
print("ok")
"""
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "TZ": "CET-1CEST,M3.5.0,M10.5.0/3"})
        assert done.stdout.strip() == "ok", done.stderr

    def test_a_host_that_slept_through_the_deadline_cancels_when_it_wakes(self):
        """The deadline is watched on the wall clock: a jump past it (a suspended host waking) cancels within a poll."""
        from orchestrator.cancel import CancelToken, Deadline

        wall = [datetime(2026, 11, 30, 5, 0, tzinfo=timezone.utc)]
        token = CancelToken()
        deadline = Deadline(datetime(2026, 11, 30, 6, 30, tzinfo=timezone.utc), token, lambda: wall[0])
        try:
            assert not token.wait(0.2)
            wall[0] += timedelta(hours=3)  # the monotonic clock counted none of it
            assert token.wait(Deadline.POLL_S * 3) and token.why == "deadline"
        finally:
            deadline.stop()


class TestBudgets:
    def test_task_token_budget_stops_that_task_only(self, config_file, server):
        """A task over its token budget is cancelled (no blame); the next task still runs."""
        tasks = [
            {"name": "hungry", "prompt": "p", "check": "python check_greet.py"},
            {"name": "fix-greet", "prompt": "p", "check": "python check_greet.py"},
        ]
        config = config_file(tasks=tasks, night={"max_tokens_per_task": 5000})
        server.enqueue(call("read_file", {"path": "greet.py"}, prompt_tokens=3000), call("list_dir", {}, prompt_tokens=3000), *FIX)
        result = run_in_process(config)
        hungry, fixed = result.tasks
        assert hungry.outcome.value == "cancelled" and "token budget" in hungry.reason
        assert fixed.outcome.value == "succeeded"


    def test_a_response_crossing_the_task_budget_counts_against_the_night_too(self, config_file, server, capsys):
        """Each response's tokens go into every budget before either stops anything: the night's
        budget sees the response that crossed a task's, and no task starts once the night's is spent."""
        tasks = [{"name": name, "prompt": "p", "check": "python check_greet.py"} for name in ("a", "b", "c")]
        config = config_file(tasks=tasks, night={"max_tokens_per_task": 5000, "max_tokens_per_night": 9000})
        server.enqueue(*[call("list_dir", {}, prompt_tokens=3999, completion_tokens=1)] * 6)
        run_in_process(config)
        a, b, c = report_json(config, capsys)["tasks"]
        assert (a["outcome"], a["reason"]) == ("cancelled", "task token budget of 5000 spent")
        assert (b["outcome"], b["reason"]) == ("cancelled", "night token budget of 9000 spent")
        assert (c["outcome"], c["iterations"]) == ("cancelled", [])
        assert [it["tokens"] for task in (a, b) for it in task["iterations"]] == [8000, 4000]
        # Turns the model answered: the turn a budget refused before its request is none (it said 3, then 2).
        assert [it["turns"] for task in (a, b) for it in task["iterations"]] == [2, 1]

    def test_finished_work_whose_submit_crosses_the_budget_is_committed(self, config_file, server, capsys):
        """The tokens of the response that crosses a budget are spent either way: if it is the submit
        of work that passes the check, the work is committed, not rolled back."""
        config = config_file(night={"max_tokens_per_task": 5000})
        server.enqueue(
            call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}, prompt_tokens=999, completion_tokens=1),
            call("submit", {"summary": "fixed"}, prompt_tokens=4499, completion_tokens=1),
        )
        [task] = run_in_process(config).tasks
        assert task.outcome.value == "succeeded" and [it.tokens for it in task.iterations] == [5500]
        assert "'hello'" in git(worktree(config, "fix-greet"), "show", "HEAD:greet.py")

    def test_finished_work_whose_submit_crosses_the_night_budget_is_committed_while_other_tasks_run(self, tmp_path, repo, capsys):
        """The night's budget refuses new iterations; it does not cancel the night: another task that
        asks to begin its next iteration must not kill the check of the answer that crossed it."""
        from orchestrator.fake_server import ScriptedServer
        from orchestrator.scripted import calls

        def respond(body):
            asked = "\n".join(str(m.get("content")) for m in body["messages"] if m["role"] == "user")
            if "FIXER" in asked:  # one answer, the fix and its submit, crossing the night's budget
                fix = ("write_file", {"path": "greet.py", "content": "def greet():\n    return 'hello'\n"})
                return calls(fix, ("submit", {"summary": "fixed"}), prompt_tokens=1000, completion_tokens=100)
            return call("submit", {"summary": "nothing"}, delay_s=0.5, prompt_tokens=5, completion_tokens=5)

        tasks = [
            {"name": "fixer", "prompt": "FIXER task", "check": "sleep 2 && python check_greet.py"},
            {"name": "other", "prompt": "OTHER task", "check": "false"},
        ]
        with ScriptedServer(responder=respond) as server:
            config = write_config(
                tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=tasks,
                night={"concurrency": 2, "max_iterations": 3, "max_tokens_per_night": 1000},
            )
            run_in_process(config)
        # By name: the report lists tasks in the order they began, which two at once may swap.
        by_name = {task["name"]: task for task in report_json(config, capsys)["tasks"]}
        fixer, other = by_name["fixer"], by_name["other"]
        assert (fixer["outcome"], [it["outcome"] for it in fixer["iterations"]]) == ("succeeded", ["committed"])
        assert "'hello'" in git(repo, "show", "overnight/fixer:greet.py")
        assert (other["outcome"], other["reason"]) == ("cancelled", "night token budget of 1000 spent")

    @pytest.mark.parametrize("prompt_tokens", [5499, 4999], ids=["past", "exactly"])
    def test_no_iteration_begins_once_the_task_budget_is_spent(self, config_file, server, capsys, prompt_tokens):
        """The response that crossed the budget was acted on (its check failed): no further iteration is
        begun only to be cancelled at its first turn, with a row, a transcript and a note of its own.
        A budget spent to its last token (5000 of 5000) is spent too."""
        config = config_file(night={"max_tokens_per_task": 5000, "max_iterations": 3})
        server.enqueue(call("submit", {"summary": "x"}, prompt_tokens=prompt_tokens, completion_tokens=1))
        run_in_process(config)
        [task] = report_json(config, capsys)["tasks"]
        assert (task["outcome"], task["reason"]) == ("cancelled", "task token budget of 5000 spent")
        assert [(it["outcome"], it["reason"]) for it in task["iterations"]] == [("rolled_back", "check_failed")]
        assert [entry.reason for entry in NotesBook(config.parent / "state" / "notes.md").entries()] == ["check_failed"]

    def test_no_request_leaves_for_a_task_begun_once_the_nights_budget_is_spent(self, config_file, server, capsys):
        """A task that comes up after the night's budget is spent is refused before its first request is
        asked ahead: each token past the budget is a cost the cap was set to stop."""
        tasks = [{"name": name, "prompt": "p", "check": "false"} for name in ("a", "b")]
        config = config_file(tasks=tasks, night={"concurrency": 1, "max_iterations": 1, "max_tokens_per_night": 1000})
        server.enqueue(*[call("submit", {"summary": "x"}, prompt_tokens=1999, completion_tokens=1)] * 2)
        run_in_process(config)
        a, b = report_json(config, capsys)["tasks"]
        assert [it["reason"] for it in a["iterations"]] == ["check_failed"]
        assert (b["outcome"], b["reason"], b["iterations"]) == ("cancelled", "night token budget of 1000 spent", [])
        assert len(server.requests) == 1

    def test_a_first_answer_no_turn_took_counts_against_the_night(self, tmp_path, repo):
        """A task's first request leaves before its worktree is made; skipped then (its branch checked out
        for review), the task never took the answer, and its tokens escaped the night's budget: a cost
        cap passed silently (found by a review)."""
        from orchestrator.fake_server import ScriptedServer

        def respond(body):
            asked = "\n".join(str(m.get("content")) for m in body["messages"] if m["role"] == "user")
            if "REVIEWED" in asked:
                return call("submit", {"summary": "x"}, prompt_tokens=49_000, completion_tokens=1_000)
            # The next task's second turn comes well after the skipped task's answer has arrived.
            turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
            if turn == 0:
                return call("read_file", {"path": "greet.py"}, delay_s=0.5, prompt_tokens=10, completion_tokens=10)
            return call("submit", {"summary": "done"}, prompt_tokens=10, completion_tokens=10)

        git(repo, "checkout", "-q", "-b", "overnight/reviewed")  # a person reviews the branch in their checkout
        tasks = [
            {"name": "reviewed", "prompt": "REVIEWED task", "check": "true"},
            {"name": "other", "prompt": "OTHER task", "check": "true"},
        ]
        with ScriptedServer(responder=respond) as server:
            config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=tasks,
                                  night={"max_tokens_per_night": 1000})
            reviewed, other = run_in_process(config).tasks
        assert reviewed.reason == "branch_checked_out"
        assert (other.outcome.value, other.reason) == ("cancelled", "night token budget of 1000 spent")

    def test_a_runaway_response_cut_off_counts_its_tokens(self, config_file, server, capsys):
        """A response stopped for runaway output used tokens: the iteration counts them, and so do the budgets."""
        config = config_file(night={"max_iterations": 3, "max_tokens_per_task": 200}, guards={"park_after": 5})
        server.enqueue(*[Reply(text="word " * 6000, prompt_tokens=2000, completion_tokens=6000)] * 3)
        run_in_process(config)
        [task] = report_json(config, capsys)["tasks"]
        [first] = task["iterations"]
        # Cut off early, the response's tokens are estimated from the prompt and what was written.
        assert first["reason"] == "runaway_output" and first["tokens"] >= 200
        assert task["reason"] == "task token budget of 200 spent"

class TestLongUse:
    def test_transcripts_older_than_kept_days_are_removed_before_the_night(self, config_file, server, capsys):
        """`[state] keep_transcripts_days`: a night deletes transcripts last written longer ago than that,
        and only those: a newer one, another file, a link and its own transcripts stay."""
        config = config_file(state={"keep_transcripts_days": 7})
        folder = config.parent / "state" / "transcripts"
        folder.mkdir(parents=True)
        long_ago = time.time() - 8 * 86400
        old, recent, other = folder / "task-run-1-a-1.jsonl", folder / "task-run-2-a-1.jsonl", folder / "mine.txt"
        for path in (old, recent, other):
            path.write_text("{}\n")
        elsewhere = config.parent / "kept.jsonl"
        elsewhere.write_text("{}\n")
        link = folder / "link.jsonl"
        link.symlink_to(elsewhere)
        for path in (old, other, elsewhere):
            os.utime(path, (long_ago, long_ago))
        os.utime(link, (long_ago, long_ago), follow_symlinks=False)
        os.utime(recent, (time.time() - 6 * 86400,) * 2)
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config), "--log-format", "json") == 0
        assert not old.exists() and recent.exists() and other.exists() and link.is_symlink() and elsewhere.exists()
        [task] = report_json(config, capsys)["tasks"]
        assert all(Path(it["transcript"]).is_file() for it in task["iterations"])

    def test_by_default_every_transcript_is_kept(self, config_file, server):
        config = config_file()
        folder = config.parent / "state" / "transcripts"
        folder.mkdir(parents=True)
        ancient = folder / "task-run-1-a-1.jsonl"
        ancient.write_text("{}\n")
        os.utime(ancient, (0, 0))
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        assert ancient.exists()


class TestFlakyServer:
    def test_server_down_pauses_the_task_and_later_tasks_run(self, config_file, server, capsys):
        """5xx through every retry pauses that task (exit 3, no note); when the server is back, the next task runs."""
        tasks = [
            {"name": "unlucky", "prompt": "p", "check": "python check_greet.py"},
            {"name": "fix-greet", "prompt": "p", "check": "python check_greet.py"},
        ]
        config = config_file(tasks=tasks, model={"retries": 2})
        server.enqueue(*[Reply(status=503)] * 3, *FIX)
        assert overnight("run", "--config", str(config)) == 3
        unlucky, fixed = report_json(config, capsys)["tasks"]
        assert unlucky["outcome"] == "paused" and unlucky["reason"] == "model_unreachable"
        assert fixed["outcome"] == "succeeded"
        assert "unlucky" not in notes_text(config)


class TestConcurrency:
    def test_tasks_run_in_parallel_without_interleaving_notes(self, config_file, server, repo):
        """Four tasks at concurrency 4 overlap in time; every notes.md entry stays whole."""
        tasks = [{"name": f"t{i}", "prompt": "p", "check": "false", "tools": ["read_file", "submit"]} for i in range(4)]
        config = config_file(tasks=tasks, night={"concurrency": 4, "max_iterations": 2})
        server.enqueue(*[call("submit", {"summary": "x"}, delay_s=0.5)] * 8)
        result = run_in_process(config)
        assert [t.outcome.value for t in result.tasks] == ["failed"] * 4
        # The server's clock, not the test's: a first import of litellm in this process is not the night's.
        first_calls = sorted(server.arrivals)[:4]
        assert first_calls[-1] - first_calls[0] < 0.5, "the four tasks' first calls did not overlap"
        entries = NotesBook(config.parent / "state" / "notes.md").entries()
        assert sorted((e.task, e.iteration) for e in entries) == [(f"t{i}", n) for i in range(4) for n in (1, 2)]
        assert all(e.reason == "check_failed" and e.text.count("**Correction:**") == 1 for e in entries)
        # Each task's place in the config is kept: reports list them so, whichever thread began first.
        with contextlib.closing(sqlite3.connect(config.parent / "state" / "runs.db")) as db:
            assert sorted(db.execute("SELECT name, position FROM task_runs").fetchall()) == [(f"t{i}", i) for i in range(4)]


class TestOverlap:
    def test_second_run_exits_75_naming_the_holder(self, config_file, tmp_path):
        """While a night holds the state dir, another `overnight run` exits 75 at once with who holds it."""
        from orchestrator.lock import StateLock

        config = config_file()
        with StateLock(config.parent / "state"):
            started = time.monotonic()
            result = subprocess.run(
                [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config)],
                capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60,
            )
        assert result.returncode == 75
        assert time.monotonic() - started < 10
        assert f"pid {os.getpid()}" in result.stderr and len(result.stderr.strip().splitlines()) == 1
        # Who holds it in full, as the issue asks: pid, host and since when.
        assert re.search(rf"pid {os.getpid()} on {re.escape(socket.gethostname())} since \d{{4}}-\d\d-\d\d \d\d:\d\d UTC", result.stderr)

    def test_a_running_nights_lock_file_names_it_in_one_json_line_and_is_emptied_after(self, config_file, server):
        """While a real `overnight run` works, overnight.lock is one JSON line naming it (`pid`, `host`, `since`,
        `command` "overnight run"), the holder a second run's exit-75 line names; once it ends the file stays, empty."""
        config = config_file(night={"max_iterations": 1}, model={"request_timeout_s": 30})
        # The night waits on this answer while the second run starts: room for a slow, loaded machine.
        server.enqueue(Reply(text="", delay_s=10))
        night = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while not server.requests and time.monotonic() < deadline and night.poll() is None:
                time.sleep(0.05)
            lock = config.parent / "state" / "overnight.lock"
            text = lock.read_text()
            second = subprocess.run(
                [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config)],
                capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60,
            )
        finally:
            _, stderr = night.communicate(timeout=60)
        [line] = text.splitlines()
        holder = json.loads(line)
        assert set(holder) == {"pid", "host", "since", "command"}
        assert (holder["pid"], holder["host"], holder["command"]) == (night.pid, socket.gethostname(), "overnight run")
        assert datetime.fromisoformat(holder["since"]).utcoffset() == timedelta(0)
        assert second.returncode == 75 and second.stderr.count("\n") == 1, second.stderr
        assert f"another overnight run holds {lock}: pid {night.pid} on {socket.gethostname()} since " in second.stderr
        assert night.returncode == 1 and "Traceback" not in stderr, stderr
        assert lock.is_file() and lock.read_text() == ""


class TestParking:
    def test_same_severe_reason_parks_the_task(self, config_file, server, capsys):
        """The same severe reason on park_after iterations in a row parks the task, with a note saying so."""
        config = config_file(night={"max_iterations": 5}, guards={"park_after": 2})
        server.enqueue(*[call("read_file", {"path": "greet.py"})] * 8, *FIX)
        assert overnight("run", "--config", str(config)) == 1
        task = report_json(config, capsys)["tasks"][0]
        assert (task["outcome"], task["reason"]) == ("parked", "parked") and len(task["iterations"]) == 2
        assert "`parked`" in notes_text(config) and "stopped 2 iterations in a row" in notes_text(config)

    def test_with_the_defaults_the_same_reason_on_every_iteration_parks_the_task(self, config_file, server, capsys):
        """max_iterations = 3 and park_after = 3: the third iteration's stop is the third alike, so `parked`, not `failed`."""
        config = config_file(night={"max_iterations": 3}, guards={"park_after": 3})
        server.enqueue(*[call("read_file", {"path": "greet.py"})] * 12)
        assert overnight("run", "--config", str(config)) == 1
        task = report_json(config, capsys)["tasks"][0]
        assert (task["outcome"], task["reason"]) == ("parked", "parked")
        assert [it["reason"] for it in task["iterations"]] == ["repeated_tool_call"] * 3

    def test_park_after_one_parks_at_the_first_severe_stop(self, config_file, server, capsys):
        """`park_after = 1` (allowed: ge=1): "same severe reason on this many iterations in a row parks the task",
        so one severe stop parks it, and its note says one iteration, as it is."""
        config = config_file(night={"max_iterations": 3}, guards={"park_after": 1})
        server.enqueue(*[call("read_file", {"path": "greet.py"})] * 12)
        assert overnight("run", "--config", str(config)) == 1
        task = report_json(config, capsys)["tasks"][0]
        assert (task["outcome"], task["reason"]) == ("parked", "parked")
        assert [it["reason"] for it in task["iterations"]] == ["repeated_tool_call"]
        assert "stopped 1 iteration in a row (repeated_tool_call)" in notes_text(config)
