"""Run one shell command unattended: no input, a hard time limit, bounded output.

Shared by the task check and the agent's `run_check` / `run_command` tools.
Nobody is awake to answer a prompt, so a command gets no stdin and no pager, and
when its time is up everything it started dies with it.
"""

from __future__ import annotations

import itertools
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Collection, Iterator, Mapping

from orchestrator.secrecy import without_secrets

TIMEOUT_EXIT_CODE = 124
# In the environment of every process overnight starts (its own git too): nothing may wait for a person.
UNATTENDED_ENV = {
    "GIT_TERMINAL_PROMPT": "0",
    # git asks an askpass program before it looks at GIT_TERMINAL_PROMPT: GIT_ASKPASS, then
    # core.askPass, then SSH_ASKPASS (VS Code's terminal and KDE set them). Set and empty, it
    # turns all three off; ssh's own use of SSH_ASKPASS goes with SSH_ASKPASS_REQUIRE=never.
    "GIT_ASKPASS": "",
    "SSH_ASKPASS_REQUIRE": "never",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
    # `git commit` without -m, `git rebase -i`, crontab -e: an editor would wait forever.
    # (GIT_SEQUENCE_EDITOR too: a user's `sequence.editor` setting outranks GIT_EDITOR.)
    "GIT_EDITOR": "true",
    "GIT_SEQUENCE_EDITOR": "true",
    "EDITOR": "true",
    "VISUAL": "true",
}
# Who commits in the agent's worktrees, whatever the user's git identity is.
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "overnight",
    "GIT_AUTHOR_EMAIL": "overnight@localhost",
    "GIT_COMMITTER_NAME": "overnight",
    "GIT_COMMITTER_EMAIL": "overnight@localhost",
}
# How git runs in the agent's worktrees, whatever the user's git config says (through the
# environment: git >= 2.31; the user's own git commands are untouched). Overnight's own git
# and every command run there (the agent's own `git commit` too) get it:
WORKTREE_GIT_CONFIG = {
    # no `git maintenance run --auto` after each commit (a process, and 3 ms, per commit);
    "maintenance.auto": "false",
    # commits not signed: they are the agent's, not the user's, and gpg would fail (no key
    # for "overnight") or wait for a passphrase nobody types;
    "commit.gpgsign": "false",
    # none of the user's hooks (--no-verify skips only pre-commit and commit-msg): a
    # prepare-commit-msg that opens an editor, a post-commit that pushes, would run unattended;
    "core.hooksPath": os.devnull,
    # no file-system monitor hook or daemon started for each task's worktree.
    "core.fsmonitor": "false",
}
WORKTREE_GIT_ENV = {
    "GIT_CONFIG_COUNT": str(len(WORKTREE_GIT_CONFIG)),
    **{f"GIT_CONFIG_KEY_{i}": key for i, key in enumerate(WORKTREE_GIT_CONFIG)},
    **{f"GIT_CONFIG_VALUE_{i}": value for i, value in enumerate(WORKTREE_GIT_CONFIG.values())},
}
# Git's variables that send every git run to one repository, index, object store or namespace, or
# add settings: inherited by overnight (started from a git hook, or a shell whose dotfiles export
# GIT_DIR), they would lead the agent's git, the check's and overnight's own to the user's
# repository instead of the worktree's. Dropped from all their environments (base_environment).
INHERITED_GIT_VARIABLES = (
    "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_NAMESPACE", "GIT_COMMON_DIR", "GIT_PREFIX", "GIT_CONFIG_PARAMETERS",
)
# Set in every command's environment to the folder it runs in (inherited by all it starts).
COMMAND_MARK = "OVERNIGHT_WORKTREE"
_READ_CHUNK = 65536
# ECMA-48 control sequences (CSI: colours, cursor moves; OSC: titles, links) and two-character escapes.
_TERMINAL_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
# How long to wait for the output pipe to close once the command's processes are gone.
_DRAIN_GRACE_S = 2.0
# How often a running command looks at the cancel token.
_CANCEL_POLL_S = 0.1
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.DOTALL)
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.+-]+")


@dataclass(frozen=True)
class CommandResult:
    """How a shell command ended; `output` is stdout and stderr merged, capped."""

    exit_code: int
    output: str
    timed_out: bool
    duration_s: float


def run_shell(
    command: str,
    cwd: Path,
    timeout_s: float,
    max_output_chars: int,
    cancel: Any = None,
    *,
    extra_env: Mapping[str, str] | None = None,
    pass_env: Collection[str] = (),
    redact: Callable[[str], str] = str,
) -> CommandResult:
    """Run `command` with bash in `cwd`; kill its whole process group after `timeout_s`.

    With a `cancel` token (orchestrator.cancel.CancelToken), a cancellation kills
    the command too and raises Cancelled once the process group is gone.
    The command runs without overnight's secret-named variables (orchestrator/secrecy.py)
    but those named in `pass_env`; `extra_env` goes on top of the environment _command_environment
    builds (the agent's commands: orchestrator/confinement.py).
    """
    started = time.monotonic()
    env = _command_environment(cwd, extra_env, pass_env)
    began = ProcessClock.now()  # what the command starts comes after it
    process = _start_in_own_session(command, cwd, env)
    collector = _OutputCollector(process.stdout, budget_bytes=max(4 * max_output_chars, 4096))
    collector.start()
    exit_code = _wait_then_stop_all(process, timeout_s, cancel, cwd, began)
    collector.join(_DRAIN_GRACE_S)
    timed_out = exit_code is None
    output = _output_of(collector, max_output_chars, redact, timed_out_after=timeout_s if timed_out else None)
    return CommandResult(
        exit_code=TIMEOUT_EXIT_CODE if exit_code is None else exit_code,
        output=output,
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
    )


def _command_environment(cwd: Path, extra_env: Mapping[str, str] | None, pass_env: Collection[str]) -> dict[str, str]:
    """What a command run in `cwd` gets: overnight's environment without its secret-named variables
    (but `pass_env`), with the settings of an unattended, worktree-bound git, the command mark, and
    `extra_env` on top."""
    # The mark lets the next night's recovery find (and stop) a command a killed night left running.
    env = {
        **without_secrets(base_environment(), pass_env), **UNATTENDED_ENV, **WORKTREE_GIT_ENV, **GIT_IDENTITY,
        COMMAND_MARK: str(cwd), "GIT_CEILING_DIRECTORIES": git_ceilings(cwd),
    }
    env.update(extra_env or {})
    return env


def _start_in_own_session(command: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`command` started with bash, in a process group of its own, stdout and stderr on one pipe."""
    return subprocess.Popen(
        command,
        shell=True,
        executable=shutil.which("bash") or "/bin/sh",
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def _wait_then_stop_all(process: subprocess.Popen[bytes], timeout_s: float, cancel: Any, cwd: Path, began: ProcessClock) -> int | None:
    """The command's exit code, None when `timeout_s` ran out; returned (or Cancelled raised) once
    nothing it started is left running: its process group, and what it started in `cwd` after `began`."""
    try:
        return _wait(process, timeout_s, cancel)
    except subprocess.TimeoutExpired:
        return None
    finally:
        # Also after a normal exit: a background child left running would hold
        # the pipe open and outlive the iteration that started it.
        kill_group(process.pid)
        process.wait()
        # And what left the group (`setsid cmd &`): it would write into the worktree after a rollback.
        stop_marked_processes(cwd, created_after=began)


def _output_of(collector: _OutputCollector, max_output_chars: int, redact: Callable[[str], str], *, timed_out_after: float | None) -> str:
    """What the command wrote, redacted and capped to `max_output_chars`, the time-out's note included
    when it ran out of time (after `timed_out_after` seconds)."""
    note = f"[timed out after {timed_out_after:g}s; the command was killed]" if timed_out_after is not None else ""
    room = max(max_output_chars - len(note) - 1, 0) if note else max_output_chars
    # Redacted before the cut: a secret the cut splits would otherwise leave its part on one side.
    output = cap_text(redact(collector.text()), room, already_cut=collector.dropped)
    if timed_out_after is not None:
        output = f"{output}\n{note}" if output else note
    return output


def base_environment() -> dict[str, str]:
    """overnight's environment without INHERITED_GIT_VARIABLES: what its commands and its git start from."""
    env = dict(os.environ)
    for name in INHERITED_GIT_VARIABLES:
        env.pop(name, None)
    return env


def git_ceilings(folder: Path) -> str:
    """GIT_CEILING_DIRECTORIES for commands run in `folder`: every folder above it.

    A ceiling stops git climbing into it, not out of it, so each one above counts: a git run
    in a worktree whose .git link the agent deleted, or after a `cd ..` out of the worktree
    (into the state dir, which may sit in the user's checkout), finds no repository rather than
    the user's checkout. Git still finds the repository of the folder it runs in, and climbs
    in any folder that is not above `folder` (a repository the agent made for itself).
    The leading empty entry: the paths are resolved already, git need not stat them again.
    """
    above = [path for path in Path(folder).resolve().parents if path != path.parent][:_CEILINGS]
    return os.pathsep.join(["", *(str(path) for path in above)])


# The nearest folders above a worktree (the state dir, the user's checkout, a home kept in git) are
# what matters; a path hundreds of folders deep made a variable too long for exec (E2BIG).
_CEILINGS = 32


def how_it_ended(exit_code: int, exited: str = "exit code") -> str:
    """`exit code N`, or for a command a signal killed (Popen's -N; bash execs a lone command, so nothing printed
    "Segmentation fault"), `killed by signal N (SIGNAME)`. The shell's own two codes are named, `exit code 127 (command
    not found)`: a missing script read as any failing test, though no change to the code mends it. `exited`: the words
    before N (the morning's reports say `exit N`)."""
    if exit_code >= 0:
        named = _SHELLS_OWN_CODES.get(exit_code)
        return f"{exited} {exit_code}" + (f" ({named})" if named else "")
    try:
        name = signal.Signals(-exit_code).name
    except ValueError:
        return f"killed by signal {-exit_code}"
    return f"killed by signal {-exit_code} ({name})"


# What bash exits with when it could not run the command at all (its manual, "Exit Status").
_SHELLS_OWN_CODES = {126: "the command is not executable", 127: "command not found"}


def _wait(process: subprocess.Popen[bytes], timeout_s: float, cancel: Any) -> int:
    """process.wait(timeout_s), but giving up at once when `cancel` is set.

    `Popen.wait(timeout)` sleeps and polls, up to 50 ms past the exit; a pidfd
    (Linux 5.3+) wakes the moment the process ends. Elsewhere, the polling wait.
    """
    try:
        exited = os.pidfd_open(process.pid)
    except (AttributeError, OSError):
        exited = None
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if cancel is not None:
                cancel.raise_if_cancelled()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise subprocess.TimeoutExpired(process.args, timeout_s)
            slice_s = min(remaining, _CANCEL_POLL_S) if cancel is not None else remaining
            if exited is None:
                try:
                    return process.wait(timeout=slice_s)
                except subprocess.TimeoutExpired:
                    continue
            if select.select([exited], [], [], slice_s)[0]:
                return process.wait()
    finally:
        if exited is not None:
            os.close(exited)


def missing_program(command: str) -> str | None:
    """The program a shell command starts with, if the shell would not find it ("command not found").

    Only a plain name is judged (after `NAME=value` assignments): one with a `/` is the
    repository's own (the agent may yet write it), and what is not a simple word (`(cd x && make)`,
    a quote left open) is left to the shell. Names not on PATH are asked of the shell itself, so
    builtins and keywords (`cd`, `test`, `[[`, `if`) pass.
    """
    if "PATH=" in command:
        return None  # the check sets its own PATH (`PATH=.venv/bin:$PATH pytest`): the shell's to judge
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    words = list(itertools.dropwhile(lambda word: _ASSIGNMENT.match(word) is not None, words))
    if not words or not _PLAIN_NAME.fullmatch(words[0]) or shutil.which(words[0]):
        return None
    shell = shutil.which("bash") or "/bin/sh"
    known = subprocess.run(
        [shell, "-c", 'command -v -- "$1"', "overnight", words[0]],
        stdin=subprocess.DEVNULL, capture_output=True, env={**os.environ, **UNATTENDED_ENV}, timeout=10,
    )
    return None if known.returncode == 0 else words[0]


def _as_a_terminal_shows(text: str) -> str:
    """A line redrawn with carriage returns (a progress bar) as its last drawing; CRLF as LF.

    Line by line, in linear time: a regex over a long line without a line break (a minified
    file `cat`), holding the GIL, froze every thread of the night for seconds.
    """
    if "\r" not in text:
        return text
    # The carriage returns at a line's end (CRLF, a last redraw) go, then what the last one left drew over.
    return "\n".join(line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n"))


def cap_text(text: str, max_chars: int, *, already_cut: int = 0) -> str:
    """Keep the head and the tail of `text` within `max_chars`, marking the cut.

    The tail gets the larger share because a failing check says what went wrong last.
    `already_cut` counts what was dropped from the middle before `text` was built.
    """
    if len(text) <= max_chars and not already_cut:
        return text
    marker_room = 40
    keep = max(max_chars - marker_room, 0)
    head = keep // 3
    tail = keep - head
    cut = len(text) - head - tail + already_cut
    return f"{text[:head]}\n[... {cut} chars cut ...]\n{text[len(text) - tail:] if tail else ''}"


@dataclass(frozen=True)
class ProcessClock:
    """Where the host's process counters stood at one moment (a command's start), so that the
    sweep after the command looks only at the processes made since: Linux's /proc; None elsewhere."""

    last_pid: int | None  # the pid given out last
    forks: int | None  # processes and threads made since boot
    ticks: int  # clock ticks since boot, as /proc/PID/stat gives a process's start

    @classmethod
    def now(cls) -> "ProcessClock":
        return cls(_last_pid(), _forks(), _boot_ticks())

    def made_since(self, pids: list[int]) -> list[int]:
        """Of `pids` (all there are), those made since this moment: the window of pids given out
        since (a few, cheap); or, when the pid counter may have gone all the way round meanwhile
        (as many processes and threads made as pids can be given out: a long build), each one
        whose start time is this moment's or later."""
        (newest, alive), forks = _pid_counter(), _forks()
        if None in (self.last_pid, self.forks, newest, forks):
            return [pid for pid in pids if _started_at_or_after(pid, self.ticks)]
        # The counter skips the pids in use, so it moves on by at most the new ones and the live ones.
        if forks - self.forks + alive >= _pid_max() - _RESERVED_PIDS:
            return [pid for pid in pids if _started_at_or_after(pid, self.ticks)]
        if newest >= self.last_pid:
            return [pid for pid in pids if self.last_pid < pid <= newest]
        return [pid for pid in pids if pid > self.last_pid or pid <= newest]  # wrapped around once meanwhile


# Linux gives out pids from 300 again after pid_max (RESERVED_PIDS); a clock tick is 1/CLK_TCK s.
_RESERVED_PIDS = 300
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _last_pid() -> int | None:
    """The pid most recently given out in this pid namespace (Linux's /proc/loadavg); None elsewhere."""
    return _pid_counter()[0]


def _pid_counter() -> tuple[int | None, int]:
    """The pid given out last, and how many processes and threads there are (Linux's /proc/loadavg)."""
    try:
        with open("/proc/loadavg", "rb") as loadavg:
            fields = loadavg.read().split()
        return int(fields[-1]), int(fields[3].split(b"/")[1])
    except (OSError, ValueError, IndexError):
        return None, 0


def _forks() -> int | None:
    """How many processes and threads the host has made since boot (/proc/stat's `processes`)."""
    try:
        with open("/proc/stat", "rb") as counters:
            data = counters.read()
        at = data.index(b"\nprocesses ") + len(b"\nprocesses ")
        return int(data[at : data.index(b"\n", at)])
    except (OSError, ValueError):
        return None


def _pid_max() -> int:
    try:
        with open("/proc/sys/kernel/pid_max", "rb") as setting:
            return int(setting.read())
    except (OSError, ValueError):
        return 32768


def _boot_ticks() -> int:
    try:
        return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _CLOCK_TICKS)
    except (AttributeError, OSError):
        return 0


def _started_at_or_after(pid: int, ticks: int) -> bool:
    try:
        return int(_stat_fields(pid)[19]) >= ticks - 1  # a tick's rounding either way
    except (OSError, IndexError, ValueError):
        return False


def stop_marked_processes(folder: Path, *, below: bool = False, created_after: ProcessClock | None = None) -> dict[int, str]:
    """Kill the process group of every process a command run in `folder` left (with `below`, a
    command run in any folder under it); returns {group: that command's folder}.

    Such a process is known by COMMAND_MARK in its environment, inherited by all a command
    starts, also by what left its process group (`setsid`, a daemon), which the group kill
    misses; or, in the sweep after a command (`created_after`), if it overwrote its environment
    to set its title (redis, postgres, anything using setproctitle: the mark is gone), by its
    current folder inside `folder`: an orphan of this user's with no terminal, made since the
    command began. Linux's /proc; elsewhere nothing is found.
    """
    my_group = os.getpgrp()
    stopped: dict[int, str] = {}
    for pid, found in _commands_processes(folder, below, created_after):
        try:
            group = os.getpgid(pid)
            if group == my_group or group in stopped:
                continue
            os.killpg(group, signal.SIGKILL)
        except OSError:  # gone meanwhile
            continue
        stopped[group] = os.fsdecode(found)
    return stopped


_no_sweep_said = threading.Event()


def _say_no_sweep() -> None:
    """Once a process: with no /proc (macOS, BSD) what a command left outside its process group is not found."""
    if not _no_sweep_said.is_set():
        _no_sweep_said.set()
        from orchestrator.logs import get_logger

        get_logger().warning(
            "orphan_sweep_unavailable", reason="no /proc: processes a command started outside its process group (setsid, daemons) are not stopped"
        )


def _commands_processes(folder: Path, below: bool, created_after: ProcessClock | None = None) -> Iterator[tuple[int, bytes]]:
    """(pid, folder of its command) of each process, other than this one, that a command run in
    `folder` (`below`: under it) left; see stop_marked_processes.

    With `created_after` (when the command began), only processes made since: the few a command
    started, not every process on the host (reading each one's environment is most of a scan's cost).
    """
    wanted = os.fsencode(str(folder))
    inside = os.fsencode(os.path.realpath(folder))
    mark = b"\0" + os.fsencode(COMMAND_MARK) + b"="
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        _say_no_sweep()
        return
    if created_after is not None:
        pids = created_after.made_since(pids)
    me = os.getpid()
    spared: set[int] | None = None  # overnight and its parents, asked once, when first needed
    for pid in pids:
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                variables = b"\0" + environ.read() + b"\0"
        except OSError:  # gone meanwhile, or not ours to read
            continue
        at = variables.find(mark)
        if at >= 0:
            start = at + len(mark)
            marked = variables[start : variables.index(b"\0", start)]
            if marked == wanted or below and marked.startswith(wanted + b"/"):
                yield pid, marked
            continue
        # A process that overwrote its environment (to set its title) is known by its folder, only
        # in the sweep after a command (made since it began) and only as an orphan: a live parent
        # outside (an editor whose helper runs in the worktree) is not the command's. Recovery, over
        # every process, goes by the mark alone: a person's detached editor there is no orphan of ours.
        if created_after is None:
            continue
        where = _folder_within(pid, inside, below)
        if where is None:
            continue
        if spared is None:
            spared = _me_and_my_parents()
        if _may_stop(pid, spared):
            yield pid, where


def _folder_within(pid: int, inside: bytes, below: bool) -> bytes | None:
    """The command folder (`inside`, or with `below` the folder under it) that the current folder
    of process `pid` is in; None when it is in neither, or cannot be read (another user's)."""
    try:
        current = os.readlink(f"/proc/{pid}/cwd".encode())
    except OSError:
        return None
    current = current.removesuffix(b" (deleted)")  # a folder a rollback removed
    if not below and current == inside:
        return inside
    if not current.startswith(inside + b"/"):
        return None
    return inside if not below else inside + b"/" + current[len(inside) + 1 :].split(b"/", 1)[0]


def _stat_fields(pid: int) -> list[bytes]:
    """/proc/PID/stat's fields from the third (state) on: [0] state, [1] parent, [4] terminal, [19] start time."""
    with open(f"/proc/{pid}/stat", "rb") as stat_file:
        return stat_file.read().rsplit(b")", 1)[1].split()


def _may_stop(pid: int, spared: set[int]) -> bool:
    """Whether a process found by its folder may be killed: this user's, with no terminal (not a
    person's shell in the worktree), neither overnight nor one of its parents, and an orphan (its
    parent init or a systemd: a daemon left behind), so never a live program's helper."""
    try:
        fields = _stat_fields(pid)
        mine = os.stat(f"/proc/{pid}").st_uid == os.getuid()
    except (OSError, IndexError):
        return False
    parent = int(fields[1])
    if parent != 1 and _name_of(parent) not in (b"systemd", b"init"):
        return False
    return mine and int(fields[4]) == 0 and pid not in spared


def _name_of(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/comm", "rb") as comm:
            return comm.read().strip()
    except OSError:
        return b""


def _me_and_my_parents() -> set[int]:
    chain, pid = set(), os.getpid()
    while pid > 0 and pid not in chain:
        chain.add(pid)
        try:
            pid = int(_stat_fields(pid)[1])
        except (OSError, IndexError, ValueError):
            break
    return chain


def kill_group(pid: int) -> None:
    """SIGKILL to a process group overnight started (gone meanwhile, or macOS's zombies, which may not be signalled: nothing to do)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _OutputCollector(threading.Thread):
    """Drains the pipe, keeping only the first and last bytes so a flood cannot fill memory."""

    def __init__(self, stream, budget_bytes: int) -> None:
        super().__init__(daemon=True)
        self._stream = stream
        self._budget = budget_bytes
        self._head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        self.dropped = 0
        # text() may run while a stray process still writes, if the pipe never closed.
        self._lock = threading.Lock()

    def run(self) -> None:
        try:
            while chunk := self._stream.read1(_READ_CHUNK):
                with self._lock:
                    self._keep(chunk)
        except (OSError, ValueError):
            pass

    def _keep(self, chunk: bytes) -> None:
        room = self._budget - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self._tail.append(chunk)
        self._tail_size += len(chunk)
        while self._tail_size - len(self._tail[0]) >= self._budget:
            self.dropped += len(self._tail[0])
            self._tail_size -= len(self._tail.popleft())

    def text(self) -> str:
        with self._lock:
            head = bytes(self._head).decode("utf-8", errors="replace")
            tail = b"".join(self._tail).decode("utf-8", errors="replace")
        # Colours and cursor moves (a tool run with FORCE_COLOR, say) are noise to a small model and to notes.md.
        return _as_a_terminal_shows(_TERMINAL_ESCAPE.sub("", head + tail))


def pid_alive(pid: int, recorded_at: datetime | None = None) -> bool:
    """True if a process with this pid runs on this host (a zombie counts as dead). With `recorded_at`
    (when the pid was written down, by the process itself), a process that began after it is another
    one: after a reboot the pids are handed out again, and a dead night's pid can be a shell's (Linux)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: alive, unless it began after the record
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return True
    if fields[0] == "Z":
        return False
    began = _process_began(fields)
    if recorded_at is not None and began is not None:
        return began <= recorded_at.timestamp() + PID_RECORD_SLACK_S
    return True


# A process starts before it records its pid; this much later still counts as the same (clocks, a shared store's).
PID_RECORD_SLACK_S = 30.0


def _process_began(stat_fields: list[str]) -> float | None:
    """When a process began (seconds since the epoch), from its /proc/<pid>/stat fields after the name."""
    try:
        ticks = int(stat_fields[19])  # field 22, starttime: clock ticks after boot
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return int(line.split()[1]) + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        pass
    return None
