"""Commands the agent runs in its worktree cannot reach past it: not the user's git, not the next iteration."""

from __future__ import annotations

import fcntl
import os
import pty
import shutil
import shlex
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from orchestrator.command_environment import COMMAND_MARK
from orchestrator.command_output import _as_a_terminal_shows
from orchestrator.commands import run_shell
from orchestrator.marked_processes import stop_marked_processes
from orchestrator.process_clock import ProcessClock
from orchestrator.process_liveness import pid_alive
from orchestrator.scripted import call
from orchestrator.worktree import Worktree
from tests.conftest import git, make_repo
from tests.test_night import overnight


class TestGitInCommands:
    def test_the_agents_own_git_commit_runs_no_user_hook_no_signing_and_is_authored_by_overnight(self, tmp_path: Path):
        """`git commit` through run_command gets overnight's git settings: no hook, no gpg, overnight as author."""
        repo = make_repo(tmp_path / "repo", {"a.txt": "a\n"})
        ran = tmp_path / "ran.log"
        hook = repo / ".git" / "hooks" / "post-commit"
        hook.write_text(f"#!/bin/sh\necho hook >> {ran}\n")
        hook.chmod(0o755)
        gpg = tmp_path / "gpg.sh"
        gpg.write_text(f"#!/bin/sh\necho gpg >> {ran}\nexit 1\n")
        gpg.chmod(0o755)
        git(repo, "config", "gpg.program", str(gpg))
        git(repo, "config", "commit.gpgsign", "true")
        git(repo, "config", "user.name", "The User")
        git(repo, "config", "user.email", "user@example.com")
        result = run_shell("git commit -q --allow-empty -m agent && git log -1 --format='%an <%ae> / %cn'", repo, 10, 1000)
        assert result.exit_code == 0, result.output
        assert result.output.strip() == "overnight <overnight@localhost> / overnight"
        assert not ran.exists(), ran.read_text()


    def test_git_variables_overnight_inherited_do_not_lead_commands_to_the_users_repository(self, tmp_path: Path, monkeypatch):
        """overnight started from a git hook or a shell exporting GIT_DIR: a command's git still works on its worktree."""
        user = make_repo(tmp_path / "user", {"a.txt": "a\n"})
        tree = Worktree.ensure(user, tmp_path / "state", "fix", "main")
        inherited = {"GIT_DIR": user / ".git", "GIT_WORK_TREE": user, "GIT_INDEX_FILE": user / ".git" / "index", "GIT_PREFIX": "sub/"}
        for name, value in inherited.items():
            monkeypatch.setenv(name, str(value))
        result = run_shell("echo new > new.txt && git add -A && git status --short", tree.path, 30, 1000)
        monkeypatch.undo()
        assert result.exit_code == 0 and result.output.strip() == "A  new.txt", result.output
        assert git(user, "status", "--porcelain") == ""


def _alive(pid: int) -> bool:
    """Running, not a zombie nobody reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _wait_dead(pid: int, within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not _alive(pid)


def _marked_sleeper(folder: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "30"], start_new_session=True, env={**os.environ, COMMAND_MARK: str(folder)})


# Leaves its process group and session, as `setsid` or a daemonising server does; writes its pid first.
DAEMON = "setsid bash -c 'echo $$ > {pid}; while true; do date > injected.txt; sleep 0.05; done' >/dev/null 2>&1 </dev/null & sleep 0.3"


class TestProcessesLeftBehind:
    def test_a_process_that_left_the_commands_session_is_stopped_when_the_command_ends(self, tmp_path: Path):
        """`setsid cmd &` escapes the process-group kill; the mark in its environment finds it."""
        work, pid_file = tmp_path / "work", tmp_path / "daemon.pid"
        work.mkdir()
        neighbour = _marked_sleeper(tmp_path / "work-2")  # another worktree's command: not this one's to stop
        try:
            assert run_shell(DAEMON.format(pid=pid_file), work, 10, 1000).exit_code == 0
            daemon = int(pid_file.read_text())
            assert _wait_dead(daemon)
            (work / "injected.txt").unlink()
            time.sleep(0.2)
            assert not (work / "injected.txt").exists() and neighbour.poll() is None
        finally:
            if pid_file.exists() and _alive(int(pid_file.read_text())):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            neighbour.kill()
            neighbour.wait()

    def test_below_stops_every_command_under_a_folder_and_nothing_beside_it(self, tmp_path: Path):
        """What recovery needs: every worktree's leftovers under worktrees/, none of a sibling folder sharing its prefix."""
        root = tmp_path / "worktrees"
        inside, beside = _marked_sleeper(root / "task"), _marked_sleeper(tmp_path / "worktrees-old" / "task")
        try:
            stopped = stop_marked_processes(root, below=True)
            assert stopped == {inside.pid: str(root / "task")}
            assert inside.wait(timeout=5) == -signal.SIGKILL and beside.poll() is None
        finally:
            for process in (inside, beside):
                process.kill()
                process.wait()

    @pytest.mark.skipif(shutil.which("perl") is None, reason="perl sets its process title")
    def test_a_daemon_that_set_its_process_title_is_stopped_by_its_folder(self, tmp_path: Path):
        """Setting the title (redis, postgres, setproctitle, Perl's $0) overwrites the environment and the mark with it."""
        work, pid_file = tmp_path / "work", tmp_path / "daemon.pid"
        work.mkdir()
        daemon = (
            f"setsid perl -e 'open P, \">{pid_file}\"; print P $$; close P; $0 = \"worker\"; "
            "while (1) { open F, \">>alive.txt\"; print F time; close F; select(undef, undef, undef, 0.05) }' "
            ">/dev/null 2>&1 </dev/null & sleep 0.5"
        )
        try:
            assert run_shell(daemon, work, 10, 1000).exit_code == 0
            assert _wait_dead(int(pid_file.read_text()))
        finally:
            if pid_file.exists() and _alive(int(pid_file.read_text())):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)

    @pytest.mark.skipif(int(Path("/proc/sys/kernel/pid_max").read_text()) > 100_000, reason="pids go round only where pid_max is small")
    def test_a_daemon_started_after_the_pids_went_round_is_stopped(self, tmp_path: Path):
        """A long build makes as many processes as there are pids: a daemon it starts then has a pid
        below the one given out before the command, outside the window of pids given out since."""
        pid_file = tmp_path / "daemon.pid"
        before = int(Path("/proc/loadavg").read_text().split()[-1])
        # Threads take pids as processes do, faster: round once, start the daemon, go on past `before`.
        spin = (
            "import subprocess, sys, threading, time\n"
            "def last(): return int(open('/proc/loadavg').read().split()[-1])\n"
            "def spin(done):\n"
            "    while not done(last()):\n"
            "        for _ in range(500): thread = threading.Thread(target=int); thread.start(); thread.join()\n"
            f"spin(lambda pid: pid < {before})\n"
            f"subprocess.Popen(['setsid', 'sh', '-c', 'echo $$ > {pid_file}; exec sleep 60'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "time.sleep(0.2)\n"
            f"spin(lambda pid: pid > {before})\n"
        )
        (tmp_path / "spin.py").write_text(spin)
        try:
            result = run_shell(f"{sys.executable} spin.py", tmp_path, 120, 1000)
            assert result.exit_code == 0, result.output
            assert int(pid_file.read_text()) < before and _wait_dead(int(pid_file.read_text()))
        finally:
            if pid_file.exists() and _alive(int(pid_file.read_text())):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)

    def test_a_command_runs_in_a_folder_hundreds_deep(self, tmp_path: Path):
        """GIT_CEILING_DIRECTORIES named every folder above: 200 folders deep, the variable passed what exec
        takes (E2BIG), and no command ran at all."""
        deep = tmp_path.joinpath(*["folder-09"] * 200)
        deep.mkdir(parents=True)
        result = run_shell("echo ran", deep, timeout_s=30, max_output_chars=1000)
        assert result.exit_code == 0 and "ran" in result.output

    def test_processes_found_by_their_folder_are_only_a_commands_orphans(self, tmp_path: Path):
        """A process without the mark (it overwrote its environment to set its title) whose folder is in a
        worktree is stopped by the sweep after a command when it is an orphan made since the command began;
        never a person's shell (a terminal), a live program's helper (an editor's, its parent alive
        outside), a folder beside the worktrees, nor by recovery's scan of every process: a person's
        editor detached in a worktree is no orphan of a night's (recovery goes by the mark)."""
        root = tmp_path / "worktrees"
        for folder in (root / "task" / "src", tmp_path / "worktrees-old" / "task"):
            folder.mkdir(parents=True)
        env = {name: value for name, value in os.environ.items() if name != COMMAND_MARK}

        def orphan(folder: Path) -> int:
            """A sleeper in its own session, no longer anyone's child but init's."""
            shell = subprocess.run(
                ["sh", "-c", "trap '' HUP; sleep 30 >/dev/null 2>&1 & echo $!"], cwd=folder, env=env, start_new_session=True,
                stdout=subprocess.PIPE, check=True,
            )
            return int(shell.stdout)

        terminal, _ = pty.openpty()
        pids: list[int] = []
        shell = editor = None
        try:
            detached = orphan(root / "task")  # before the command: the person's detached editor
            pids.append(detached)
            began = ProcessClock.now()
            pids.append(inside := orphan(root / "task" / "src"))
            pids.append(beside := orphan(tmp_path / "worktrees-old" / "task"))
            shell = subprocess.Popen(  # the person's shell, and what it runs, in the worktree
                ["sh", "-c", "sleep 30 & echo $!; wait"], cwd=root / "task", env=env, start_new_session=True,
                stdin=terminal, stdout=subprocess.PIPE, preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
            )
            pids.append(person := int(shell.stdout.readline()))
            editor = subprocess.Popen(  # an editor, outside, whose helper runs in the worktree
                ["sh", "-c", f"cd {shlex.quote(str(root / 'task'))} && sleep 30 & echo $!; wait"], cwd=tmp_path, env=env,
                start_new_session=True, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
            )
            pids.append(helper := int(editor.stdout.readline()))
            assert stop_marked_processes(root, below=True) == {}
            assert list(stop_marked_processes(root / "task", created_after=began).values()) == [str(root.resolve() / "task")]
            assert _wait_dead(inside)
            assert _alive(detached) and _alive(beside) and _alive(person) and _alive(helper)
        finally:
            for pid in pids:
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)
            for parent in (shell, editor):
                if parent is not None:
                    parent.kill()
                    parent.wait()
                    parent.stdout.close()
            os.close(terminal)

    def test_an_orphan_with_a_terminal_is_a_persons_and_not_stopped(self, tmp_path: Path):
        """A person's `(cmd &)` in a terminal in the worktree, while a command of the agent's runs: the subshell
        is gone, so the job is an orphan made since the command began, in the worktree, without the mark; its
        terminal (held by the person's shell) says it is the person's."""
        work = tmp_path / "worktrees" / "task"
        work.mkdir(parents=True)
        env = {name: value for name, value in os.environ.items() if name != COMMAND_MARK}
        terminal, _ = pty.openpty()
        began = ProcessClock.now()
        shell = subprocess.Popen(
            ["sh", "-c", "(sleep 30 >/dev/null 2>&1 & echo $!); exec sleep 30"], cwd=work, env=env, start_new_session=True,
            stdin=terminal, stdout=subprocess.PIPE, preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        )
        job = int(shell.stdout.readline())
        try:
            fields = Path(f"/proc/{job}/stat").read_text().rsplit(")", 1)[1].split()
            assert int(fields[4]) != 0  # it has the terminal
            assert stop_marked_processes(work, created_after=began) == {}
            assert _alive(job)
        finally:
            if _alive(job):
                os.kill(job, signal.SIGKILL)
            shell.kill()
            shell.wait()
            shell.stdout.close()
            os.close(terminal)

    def test_a_daemon_started_in_a_failed_iteration_does_not_reach_the_next_iterations_commit(
        self, config_file, server, repo, tmp_path: Path
    ):
        """Iteration 1 starts a setsid daemon and fails; it must not write into the worktree after the rollback."""
        pid_file = tmp_path / "daemon.pid"
        tools = ["read_file", "edit_file", "run_command", "submit"]
        config = config_file(tasks=[{"name": "fix-greet", "prompt": "p", "check": "python check_greet.py", "tools": tools}])
        server.enqueue(
            call("run_command", {"command": DAEMON.format(pid=pid_file)}),
            call("submit", {"summary": "not yet"}),
            call("run_command", {"command": "sleep 0.5; ls"}),
            call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}),
            call("submit", {"summary": "fixed"}),
        )
        try:
            assert overnight("run", "--config", str(config)) == 0
            assert git(repo, "show", "--name-only", "--format=", "overnight/fix-greet") == "greet.py"
            assert _wait_dead(int(pid_file.read_text()))
        finally:
            if pid_file.exists() and _alive(int(pid_file.read_text())):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


class TestOutputAsSeen:
    def test_carriage_returns_keep_what_a_terminal_would_show(self, tmp_path: Path):
        """A progress bar redraws its line with \\r: the output keeps the last drawing, as the terminal did."""
        script = r"printf 'step 10%%\rstep 50%%\rstep 100%%\nnext\r\n'"
        result = run_shell(script, cwd=tmp_path, timeout_s=30, max_output_chars=8000)
        assert result.output == "step 100%\nnext\n"

    def test_a_long_line_or_a_long_run_of_carriage_returns_is_cleaned_in_linear_time(self, tmp_path: Path):
        """A minified file `cat` (one line, no \\r) or a run of \\r is cleaned at once, not in seconds holding the GIL."""
        script = r"head -c 120000 /dev/zero | tr '\0' a; echo; head -c 20000 /dev/zero | tr '\0' '\r'; printf x"
        started = time.monotonic()
        result = run_shell(script, cwd=tmp_path, timeout_s=30, max_output_chars=200_000)
        assert time.monotonic() - started < 2  # 17 s with the quadratic regexes this replaced
        assert result.output == "a" * 120000 + "\nx"

    def test_carriage_returns_are_read_line_by_line_as_before(self):
        """CRLF, lone \\r, trailing \\r and runs of them: each line shows what was drawn last."""
        cases = {
            "a\r\nb\n": "a\nb\n", "a\rb": "b", "abc\rX\r": "X", "a\r\r\rb\r\r\n\r": "b\n", "\r": "", "x\r\n\ry": "x\ny",
        }
        for text, shown in cases.items():
            assert _as_a_terminal_shows(text) == shown, text


class TestGitCeiling:
    def test_git_in_a_worktree_without_its_link_finds_no_repository_above_it(self, tmp_path: Path):
        """The agent deleted `.git`: its next `git add`/`git commit` must not reach the checkout the state dir sits in."""
        user = make_repo(tmp_path / "user", {"a.txt": "mine\n"})
        (user / "a.txt").write_text("uncommitted, the user's\n")
        worktree = user / ".overnight" / "worktrees" / "t"
        worktree.mkdir(parents=True)
        result = run_shell("git status --porcelain", cwd=worktree, timeout_s=30, max_output_chars=8000)
        assert result.exit_code != 0 and "not a git repository" in result.output
        for out in ("..", "../.."):  # a `cd ..` into worktrees/ or the state dir: every folder above is a ceiling
            result = run_shell(f"cd {out} && git status --porcelain", cwd=worktree, timeout_s=30, max_output_chars=8000)
            assert result.exit_code != 0 and "not a git repository" in result.output, (out, result.output)
        assert (user / "a.txt").read_text() == "uncommitted, the user's\n"


class TestPidsWrittenDown:
    @pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux's /proc")
    def test_a_live_process_whose_name_is_not_utf8_is_alive(self, tmp_path: Path):
        """A recorded pid whose process has a name that is not UTF-8 (any bytes a program chose) is alive, not a UnicodeDecodeError."""
        program = os.path.join(os.fsencode(tmp_path), b"sleep\xff\xfe")
        shutil.copy(shutil.which("sleep") or "/bin/sleep", program)
        os.chmod(program, 0o755)
        sleeper = subprocess.Popen([program, "30"])
        try:
            deadline = time.monotonic() + 10
            while b"\xff" not in Path(f"/proc/{sleeper.pid}/stat").read_bytes():  # the name is the program's once it runs
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert pid_alive(sleeper.pid) is True
        finally:
            sleeper.kill()
            sleeper.wait()


class TestTheCommandsPipe:
    def test_a_commands_output_pipe_is_closed_once_read_not_left_to_the_garbage_collector(self, tmp_path: Path):
        """Left open, each command's pipe was a ResourceWarning: a plain line in the JSON logs under PYTHONWARNINGS=default."""
        import gc
        import warnings

        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always", ResourceWarning)
            assert run_shell("echo hello", tmp_path, 10, 1000).output.strip() == "hello"
            gc.collect()
        assert [str(warning.message) for warning in seen if issubclass(warning.category, ResourceWarning)] == []
