"""`overnight demo`: a real night with the embedded model on a small sample repository.

The sample has three real tasks (a failing test to fix, a function to add, a
typo). The tiny model is expected to struggle: the demo is there to show the
guards catching it, the rollbacks and the notes, and to leave every file in
place so a person can look around afterwards.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from orchestrator.config import Config, parse_config
from orchestrator.errors import ConfigError
from orchestrator.files import absolute
from orchestrator.report import counted

if TYPE_CHECKING:
    from orchestrator.night_end import NightResult

SAMPLE_FILES = {
    "README.md": """\
        # sample

        A tiny project for `overnight demo`. Run the tests with `python3 -m unittest`.
        """,
    "calc.py": '''\
        """Small arithmetic helpers."""


        def average(numbers):
            """The mean of a non-empty list of numbers."""
            return sum(numbers) / (len(numbers) + 1)
        ''',
    "greet.py": '''\
        """Greetings for the front page."""


        def greeting(name):
            """A friendly greeting for `name`."""
            return f"Helo, {name}!"
        ''',
    "test_average.py": """\
        import unittest

        from calc import average


        class AverageTest(unittest.TestCase):
            def test_mean_of_two_numbers(self):
                self.assertEqual(average([2, 4]), 3)

            def test_mean_of_one_number(self):
                self.assertEqual(average([5]), 5)
        """,
    "test_clamp.py": """\
        import unittest

        import calc


        class ClampTest(unittest.TestCase):
            def test_value_inside_the_range_is_unchanged(self):
                self.assertEqual(calc.clamp(5, 0, 10), 5)

            def test_value_below_the_range_becomes_low(self):
                self.assertEqual(calc.clamp(-3, 0, 10), 0)

            def test_value_above_the_range_becomes_high(self):
                self.assertEqual(calc.clamp(42, 0, 10), 10)
        """,
    "test_greet.py": """\
        import unittest

        from greet import greeting


        class GreetingTest(unittest.TestCase):
            def test_greeting_says_hello(self):
                self.assertEqual(greeting("Ada"), "Hello, Ada!")
        """,
    ".gitignore": "__pycache__/\n*.pyc\n",
}

# name, prompt, the test module its check runs
SAMPLE_TASKS = (
    (
        "fix-average",
        "The test in test_average.py fails: average() in calc.py returns the wrong value. "
        "Fix average() in calc.py. Do not change the tests.",
        "test_average",
    ),
    (
        "add-clamp",
        "Add a function clamp(value, low, high) to calc.py. It returns value, limited to the range "
        "from low to high. test_clamp.py shows how it is used. Keep average() as it is.",
        "test_clamp",
    ),
    (
        "fix-typo",
        "greeting() in greet.py says 'Helo' instead of 'Hello'. Fix the typo.",
        "test_greet",
    ),
)

_GIT_IDENTITY = ("-c", "user.name=overnight demo", "-c", "user.email=demo@localhost", "-c", "commit.gpgsign=false")

# Log events shown as progress lines; everything goes to night.log as JSON.
_PROGRESS = {
    "local_model_started": "model ready: {model_file} on port {port}, context {context_size}, {threads}, {startup_s} s to start",
    "task_started": "task {task} (branch {branch})",
    "iteration_started": "  iteration {iteration}: working…",
    "model_call": "    model answered: {tokens} in {latency_ms} ms, {calls}",
    "tool_call": "    tool {tool}: {ok_word}",
    "iteration_committed": "  iteration {iteration}: committed {commit} after {turns}, {tokens}",
    "iteration_rolled_back": "  iteration {iteration}: rolled back ({reason}) after {turns}, {tokens}",
    "iteration_cancelled": "  iteration {iteration}: cancelled ({why})",
    "iteration_error": "  iteration {iteration}: error in overnight (see night.log)",
    "task_finished": "task {task}: {outcome}{reason_part}",
    "local_model_stopped": "model stopped",
    "local_model_file_damaged": "model file damaged ({model_file}); writing it again and starting once more…",
    "local_model_died": "model server died (exit {exit_code}); starting it again…",
    "local_model_restarted": "model ready again on port {port}",
    "local_model_not_restarted": "model server not started again: {error}",
}
# The progress lines' counts, in words as the morning report counts (`1 turn`, `2 turns`); night.log keeps the numbers.
_COUNTED = {"turns": "turn", "tokens": "token", "calls": "native call", "threads": "thread"}


def make_sample_repo(path: Path) -> Path:
    """A fresh git repository with the sample project, one commit on `main`; its checks fail until fixed."""
    if path.exists() and any(path.iterdir()):
        raise ConfigError(f"{path} is not empty; the demo needs a new folder")
    path.mkdir(parents=True, exist_ok=True)
    for name, text in SAMPLE_FILES.items():
        (path / name).write_text(textwrap.dedent(text), encoding="utf-8")
    _git(path, "init", "-q", "-b", "main")
    _git(path, "add", "-A")
    _git(path, *_GIT_IDENTITY, "commit", "-q", "-m", "sample project for overnight demo")
    return path


def check_command(test_module: str) -> str:
    """The sample's check: its unittest module, without writing bytecode into the worktree."""
    python = "python3" if shutil.which("python3") else shlex.quote(sys.executable)
    return f"{python} -B -m unittest -q {test_module}"


def overnight_command() -> str:
    """How to call this overnight from the person's shell: its full path when `overnight` on PATH is not it.

    `bash scripts/demo.sh` runs overnight from its .venv without putting that on PATH, so a bare
    `overnight report` after it was "command not found" (or another install's)."""
    here = Path(sys.executable).parent / "overnight"
    if not here.is_file():
        return "overnight"
    found = shutil.which("overnight")
    return "overnight" if found is not None and Path(found).resolve() == here.resolve() else shlex.quote(str(here))


def demo_toml(repo: Path, state_dir: Path) -> str:
    """The demo's overnight.toml: the embedded model, three tasks, limits that end in minutes."""
    lines = [
        f"# Written by `overnight demo`. Rerun the night with: {overnight_command()} run -c <this file>",
        "[model]",
        'name = "local"',
        "request_timeout_s = 60",
        "max_tokens = 512",
        "# Six turns of a chatty small model outgrow 4096 tokens; the KV cache of 270M is small.",
        "context_window = 8192",
        "",
        "[repo]",
        f"path = {json.dumps(str(repo))}",
        "",
        "[state]",
        f"dir = {json.dumps(str(state_dir))}",
        "",
        "[night]",
        "max_iterations = 2",
        "max_turns = 6",
        "check_timeout_s = 60",
        "command_timeout_s = 30",
    ]
    for name, prompt, module in SAMPLE_TASKS:
        lines += ["", "[[task]]", f"name = {json.dumps(name)}", f"prompt = {json.dumps(prompt)}"]
        lines.append(f"check = {json.dumps(check_command(module))}")
    return "\n".join(lines) + "\n"


def demo_config(repo: Path, state_dir: Path) -> Config:
    """The demo's config, as read back from the overnight.toml it would write next to the state dir."""
    source = state_dir.parent / "overnight.toml"
    return parse_config(tomllib.loads(demo_toml(repo, state_dir)), source=source)


def prepare_sample(workdir: Path) -> Config:
    """Make the sample repository under `workdir` and write its overnight.toml; return the config."""
    try:
        workdir = workdir.resolve()
        _refuse_a_folder_git_keeps(workdir)
        # The demo writes overnight.toml and state/ as well as the sample: nothing of a person's may be there.
        if workdir.exists() and (not workdir.is_dir() or any(workdir.iterdir())):
            raise ConfigError(f"--dir {workdir} is not an empty folder; the demo needs a new or empty one")
        repo = make_sample_repo(workdir / "sample-repo")
        state_dir = workdir / "state"
        (workdir / "overnight.toml").write_text(demo_toml(repo, state_dir), encoding="utf-8")
    except (OSError, RuntimeError) as exc:  # a folder that cannot be made there; a symlink loop
        raise ConfigError(f"--dir {workdir}: cannot make the sample there: {getattr(exc, 'strerror', None) or exc}") from None
    return demo_config(repo, state_dir)


def _refuse_a_folder_git_keeps(workdir: Path) -> None:
    """ConfigError when `workdir` lies inside a git folder (a checkout's `.git`, a bare repository): the sample,
    its config and the night's state would be written among git's own files, as `init` refuses to write there.
    A folder inside a checkout is fine: the demo works on its own sample repository, not on the checkout."""
    from orchestrator.checkout import git_folder_around

    git_folder = git_folder_around(_nearest_existing(workdir))
    if git_folder is not None:
        raise ConfigError(
            f"--dir {workdir} is inside the git folder {git_folder}, where git keeps its own files: "
            f"choose a folder outside it (the demo makes its own sample repository)"
        )


def _nearest_existing(folder: Path) -> Path:
    """`folder`, or the nearest folder above it that exists: git is asked in a folder that is there, and a new
    --dir lies in whatever git folder that one lies in."""
    return next((above for above in (folder, *folder.parents) if above.is_dir()), folder)


def run_sample_night(config: Config, on_signal: Any = None, cancel: Any = None) -> "NightResult":
    """One night on the sample with the embedded model; the server is stopped whatever happens."""
    from orchestrator.build import night_parts
    from orchestrator.night import run_night

    with night_parts(config, cancel=cancel) as parts:
        if on_signal is not None:
            parts = dataclasses.replace(parts, on_signal=on_signal)
        return run_night(parts)


def run_demo(workdir: Path | None, out: TextIO, cancel: Any = None) -> int:
    """Make the sample, run a night on it with the embedded model, print the report and notes.

    Returns 0 when the night ran to its end (the tiny model failing tasks is the
    expected show), 3 when the embedded model could not be reached, the signal's
    code (129, 130, 143) when `cancel` was cancelled by one.
    """
    from orchestrator.console import SignalPrinter
    from orchestrator.night_end import EXIT_MODEL_UNREACHABLE, SIGNAL_EXIT_CODES

    from orchestrator.cpu_threads import default_threads

    default_threads()  # a bad OVERNIGHT_LOCAL_THREADS: exit 2 before the sample is made in the folder
    workdir = absolute(workdir, ConfigError, "--dir") if workdir is not None else Path(tempfile.mkdtemp(prefix="overnight-demo-"))
    config = prepare_sample(workdir)
    _say(out, f"overnight demo in {workdir}")
    _say(out, f"sample repository: {config.repo_path} ({len(config.task)} tasks); starting the embedded model…")
    started = time.monotonic()
    try:
        with _progress_logging(out, config.state_dir / "night.log"):
            result = run_sample_night(config, on_signal=SignalPrinter(out), cancel=cancel)
        _say(out, f"night finished in {time.monotonic() - started:.0f} s\n")
        _print_morning(config, out)
    finally:
        _print_locations(workdir, config, out)
    return result.exit_code if result.exit_code in (EXIT_MODEL_UNREACHABLE, *SIGNAL_EXIT_CODES.values()) else 0


def _print_morning(config: Config, out: TextIO) -> None:
    from orchestrator.build import open_store
    from orchestrator.notes import NotesBook
    from orchestrator.printable import visible_document
    from orchestrator.report import as_text

    store = open_store(config)
    try:
        latest = store.latest_run()
    finally:
        store.close()
    _say(out, "──── morning report (overnight report) ────")
    out.write(as_text(latest, base="main") if latest else "(no run recorded)\n")
    _say(out, "\n──── notes.md (overnight notes) ────")
    # As `overnight notes` shows it: the sample's code the check ran (the model's) may have written there too, bytes that
    # are not UTF-8 among them (read strictly, they ended the demo in a traceback).
    text = NotesBook(config.notes_path).text()
    out.write(visible_document(text) if text else "(no notes: every iteration committed)\n")
    out.flush()


def _print_locations(workdir: Path, config: Config, out: TextIO) -> None:
    from runs.engine import store_shown

    state = config.state_dir
    _say(out, "\n──── where everything is ────")
    for label, where in (
        ("sample repository", config.repo_path),
        ("config", workdir / "overnight.toml"),
        ("task worktrees", config.worktrees_dir),
        ("notes", config.notes_path),
        ("run database", store_shown(config.store_url)),
        ("transcripts", config.transcripts_dir),
        ("night log", state / "night.log"),
        ("model server log", state / "llama-server.log"),
    ):
        _say(out, f"  {label + ':':20} {where}")
    _say(out, f"  try: {overnight_command()} report -c {shlex.quote(str(workdir / 'overnight.toml'))}")


class _Progress:
    """A structlog processor: every event as JSON to night.log, a few as short lines on screen."""

    def __init__(self, log_file: TextIO) -> None:
        self.log_file = log_file

    def __call__(self, logger: Any, method: str, event: dict[str, Any]) -> str:
        import structlog

        self.log_file.write(json.dumps(event, default=str) + "\n")
        self.log_file.flush()
        template = _PROGRESS.get(event.get("event", ""))
        if template is None:
            raise structlog.DropEvent
        fields = dict(event)
        fields["ok_word"] = "ok" if event.get("ok") else "failed"
        fields["reason_part"] = f" ({event['reason']})" if event.get("reason") else ""
        if "commit" in event and not event["commit"]:  # the check passed on the iteration's checkpoint as it was
            fields["commit"] = "nothing new"
        fields["model_file"] = Path(str(event.get("model_file", ""))).name
        fields.update({key: counted(event[key], word) for key, word in _COUNTED.items() if isinstance(event.get(key), int)})
        try:
            return template.format(**fields)
        except (KeyError, IndexError, ValueError):
            return str(event.get("event"))


class _progress_logging:
    """Route structlog to the progress processor for the demo, and put the old setup back after."""

    def __init__(self, out: TextIO, log_path: Path) -> None:
        self.out = out
        self.log_path = log_path

    def __enter__(self) -> None:
        import logging

        import structlog

        self.saved = structlog.get_config()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_file = self.log_path.open("a", encoding="utf-8")
        structlog.configure(
            processors=[
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.format_exc_info,
                _Progress(self.log_file),
            ],
            wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
            logger_factory=structlog.PrintLoggerFactory(self.out),
            cache_logger_on_first_use=False,
        )

    def __exit__(self, *exc: object) -> None:
        import structlog

        structlog.configure(**self.saved)
        self.log_file.close()


def _say(out: TextIO, line: str) -> None:
    print(line, file=out, flush=True)


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"}
    done = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise ConfigError(f"git {args[-1] if args else ''} failed in {repo}: {done.stderr.strip()[:200]}")
    return done.stdout
