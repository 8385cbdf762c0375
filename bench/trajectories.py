"""The struggle benchmark's library: scripted trajectories over one small project.

Each trajectory is a model script plus what it should show: the struggle kind
(or "healthy"), the turn where the struggle begins, and which signal kinds
count as noticing it. The project is a few files and `check.py`, which passes
once greet.py says 'hello', so run_check's result changes after an edit.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

from orchestrator.scripted import Reply, call, calls, say

HEALTHY = "healthy"
PY = f"{shlex.quote(sys.executable)} -S"
CHECK_COMMAND = f"{PY} check.py"

LONG_PATH = "src/main/python/com/example/greetings/service/internal/formatting/legacy_greeting_formatter.py"
FILES: dict[str, str] = {
    "greet.py": "def greet():\n    return 'helo'\n",
    "check.py": "import greet\nassert greet.greet() == 'hello', 'greet() returned ' + repr(greet.greet())\nprint('ok')\n",
    "notes.txt": "Fix the greeting. The check is check.py; it must print ok.\n",
    # Each run of poll.py advances a counter: a job that finishes on the 3rd look.
    "poll.py": (
        "import pathlib\np = pathlib.Path('count.txt')\nn = int(p.read_text()) + 1 if p.exists() else 1\n"
        "p.write_text(str(n))\nprint('build step', n, 'of 6:', 'done' if n >= 3 else 'running')\n"
    ),
    # A slow job whose status line shows only an advancing elapsed time; done on the 5th look.
    "install.py": (
        "import pathlib\np = pathlib.Path('install.count')\nn = int(p.read_text()) + 1 if p.exists() else 1\n"
        "p.write_text(str(n))\nprint('deps: done' if n >= 5 else f'deps: still installing, {n * 2.5:.1f}s elapsed')\n"
    ),
    # Fails on its first run only, like a flaky network fetch.
    "flaky.py": (
        "import pathlib, sys\np = pathlib.Path('flaky.seen')\nfirst = not p.exists()\np.write_text('x')\n"
        "print('fetch failed: connection reset' if first else 'fetched 3 packages')\nsys.exit(1 if first else 0)\n"
    ),
    # A failing test run that reports how long it took, as pytest does: the output differs every run.
    "timed_check.py": (
        "import sys, time\nprint('F\\nE   assert greet() == hello\\n1 failed in %.2fs' % (time.time() % 1))\nsys.exit(1)\n"
    ),
    # A long path, read page by page: the calls share their first 100 characters.
    LONG_PATH: "".join(f"line {i}\n" for i in range(400)),
    **{f"lib/m{i}.py": f"def part{i}():\n    return {i}\n" for i in range(1, 7)},
}
FIXED = "def greet():\n    return 'hello'\n"


@dataclass(frozen=True)
class Trajectory:
    """One scripted run; `onset` is the 1-based turn where the struggle begins (0 when healthy)."""

    name: str
    kind: str
    onset: int
    replies: tuple[Reply, ...]
    # Signal kinds that count as noticing this struggle (any severe counts too).
    accept: tuple[str, ...] = ()
    max_turns: int = 30
    context_window: int | None = 100_000
    max_output_chars: int = 20_000
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return self.kind == HEALTHY

    @property
    def accepted(self) -> tuple[str, ...]:
        return self.accept or (self.kind,)


# --- replies -------------------------------------------------------------------


def read(path: str = "greet.py") -> Reply:
    return call("read_file", {"path": path})


def ls(path: str = ".") -> Reply:
    return call("list_dir", {"path": path})


def check() -> Reply:
    return call("run_check")


def run(command: str) -> Reply:
    return call("run_command", {"command": command})


def fix(old: str = "'helo'", new: str = "'hello'") -> Reply:
    return call("edit_file", {"path": "greet.py", "old": old, "new": new})


def write(path: str, content: str) -> Reply:
    return call("write_file", {"path": path, "content": content})


def submit() -> Reply:
    return call("submit", {"summary": "greet() says hello"})


FINISH = (fix(), check(), submit())


def _struggles() -> list[Trajectory]:
    return [
        Trajectory("repeat-read", "repeated_tool_call", 1, (read(),) * 6),
        Trajectory("repeat-after-progress", "repeated_tool_call", 4, (read(), fix("'helo'", "'hallo'"), check()) + (read(),) * 6),
        Trajectory("repeat-failing-check", "repeated_tool_call", 2, (read(),) + (check(),) * 6,
                   accept=("repeated_tool_call", "failing_streak")),
        Trajectory("repeat-path-noise", "repeated_tool_call", 1,
                   (read("greet.py"), read("./greet.py"), read(".//greet.py"), read("./greet.py"), read("greet.py"))),
        Trajectory("repeat-space-noise", "repeated_tool_call", 1,
                   (run("cat notes.txt"), run("cat  notes.txt"), run("cat notes.txt "), run(" cat notes.txt"), run("cat notes.txt"))),
        Trajectory("repeat-newline-noise", "repeated_tool_call", 1, (run("cat notes.txt"), run("cat notes.txt\n")) * 3,
                   note="a command ending in a newline is the same command"),
        Trajectory("repeat-changing-arg", "repeated_tool_call", 1,
                   (run("cat notes.txt"), run("cat notes.txt 2>&1"), run("cat notes.txt 2>/dev/null"),
                    run("cat notes.txt # again"), run("cat notes.txt | cat")) + FINISH,
                   note="warning only: the calls differ"),
        Trajectory("repeat-timed-check", "repeated_tool_call", 1, (run(f"{PY} timed_check.py"),) * 6,
                   note="the outputs differ only in pytest's `in 0.42s`"),
        Trajectory("loop2-timed-check", "dead_loop", 1, (read(), run(f"{PY} timed_check.py")) * 4,
                   accept=("dead_loop", "failing_streak")),
        Trajectory("loop2-reads", "dead_loop", 1, (read(), read("notes.txt")) * 4),
        Trajectory("loop2-noisy", "dead_loop", 1,
                   (read("greet.py"), read("./notes.txt"), read("./greet.py"), read("notes.txt"), read(".//greet.py"), read("notes.txt "))),
        Trajectory("loop2-multicall", "dead_loop", 1,
                   (calls(("read_file", {"path": "greet.py"}), ("list_dir", {})), call("search", {"pattern": "greet"})) * 3),
        Trajectory("loop3-reads", "dead_loop", 1, (read(), read("notes.txt"), ls()) * 3 + FINISH),
        Trajectory("loop3-after-progress", "dead_loop", 3,
                   (read(), fix("'helo'", "'hallo'")) + (read(), call("search", {"pattern": "hallo"}), ls()) * 3 + FINISH),
        Trajectory("loop2-after-progress", "dead_loop", 3, (read(), fix("'helo'", "'hallo'")) + (read(), read("notes.txt")) * 3 + FINISH),
        Trajectory("failing-guesses", "failing_streak", 1,
                   (read("src/greet.py"), read("lib/greet.py"), read("greeting.py"), read("app/greet.py")) + FINISH),
        Trajectory("failing-slow-prose", "failing_streak", 1,
                   (read("config.yml"), say("Hmm, let me think."), read("conf/config.yml"), say("Maybe yaml."), read("config.yaml")) + FINISH),
        Trajectory("failing-edits", "failing_streak", 1,
                   (fix("'hi'", "'hello'"), fix("return 'helo' ", "return 'hello'"), fix("'Helo'", "'hello'")) + FINISH),
        Trajectory("read-failedit-circle", "failing_streak", 2,
                   tuple(r for old in ("return 'hi'", "return  'helo'", 'return "helo"', "retrun 'helo'", "return 'Helo'",
                                       "return'helo'", "return 'hel0'")
                         for r in (read(), fix(old, "return 'hello'"))) + FINISH,
                   note="the same read between failed edits, each with another `old`"),
        Trajectory("flip-flop-edit", "failing_streak", 3, (fix("'helo'", "'Hello'"), check(), fix("'Hello'", "'helo'"), check()) * 5,
                   accept=("failing_streak", "dead_loop"), note="the undo restores the original: no progress"),
        Trajectory("flip-flop-writes", "failing_streak", 5,
                   (write("greet.py", "def greet():\n    return 'Hello'\n"), check(),
                    write("greet.py", "def greet():\n    return 'hello '\n"), check()) * 5, accept=("failing_streak", "dead_loop")),
        Trajectory("rewrite-same-content", "dead_loop", 3, (write("greet.py", "def greet():\n    return 'Hello'\n"), check()) * 8,
                   accept=("failing_streak", "dead_loop")),
        Trajectory("empty-twice", "empty_response", 1, (say(""), say(""), submit())),
        Trajectory("empty-after-progress", "empty_response", 3, (read(), fix(), say(""), say(""))),
        Trajectory("prose-empty-alternating", "no_tool_call", 1, (say("I will now read greet.py."), say("")) * 5,
                   note="only the stop counts: each kind alone is warned about but reset by the other"),
        Trajectory("mixed-unusable-answers", "no_tool_call", 1,
                   (call("bash", {"cmd": "cat greet.py"}), call("write_file", '{"path": "greet.py" "content"'),
                    say("I will now fix greet.py."), say("")) * 3,
                   note="only the stop counts: every answer is unusable, each in another way"),
        Trajectory("unknown-tool", "unknown_tool", 1, (call("bash", {"cmd": "ls"}),) * 4),
        Trajectory("empty-tool-name", "empty_tool_name", 1, (call("", {"path": "greet.py"}),) * 4),
        Trajectory("broken-json", "broken_tool_call", 1,
                   tuple(call("write_file", a) for a in ('{{{', '{"path": "greet.py" "content"', "[1, 2", "{{{", "{{{"))),
        Trajectory("broken-repaired-garbage", "broken_tool_call", 1, (call("write_file", "}{ path => x ;; ]["),) * 5),
        Trajectory("broken-cut-mid-value", "broken_tool_call", 1,
                   (call("edit_file", '{"path": "greet.py", "old": "helo", "new": '),) * 5,
                   note="cut off though the answer ended as usual: repaired, each would be an edit to \"\""),
        Trajectory("broken-cut-single-quoted", "broken_tool_call", 1,
                   (call("write_file", "{'path': 'greet.py', 'content': 'def greet():\\n    return"),) * 5,
                   note="JSON5-like, cut inside a string: repaired, each would write half a file"),
        Trajectory("runaway-long-text", "runaway_output", 2, (read(), say("Let me explain. " + "x" * 25_000))),
        Trajectory("runaway-repeating-args", "runaway_output", 2,
                   (read(), call("write_file", {"path": "greet.py", "content": "print('hello')\n" * 200}))),
        Trajectory("context-filling", "context_full", 4,
                   tuple(call("read_file", {"path": f"lib/m{i}.py"}, prompt_tokens=t)
                         for i, t in zip(range(1, 7), (20_000, 45_000, 70_000, 82_000, 90_000, 95_000))) + FINISH),
        Trajectory("max-turns", "max_turns", 8,
                   tuple(read(f"lib/m{i}.py") for i in range(1, 7)) + (read(), read("notes.txt")), max_turns=8),
    ]


def _healthy() -> list[Trajectory]:
    def h(name: str, *replies: Reply, **options: Any) -> Trajectory:
        return Trajectory(name, HEALTHY, 0, replies, **options)

    return [
        h("edit-then-recheck", check(), read(), fix(), check(), submit()),
        h("fix-test-fix", check(), fix("'helo'", "'hallo'"), check(), fix("'hallo'", "'helo!'"), check(), fix("'helo!'", "'hello'"), check(), submit()),
        h("reread-after-edit", read(), fix("'helo'", "'hallo'"), read(), fix("'hallo'", "'hello'"), read(), check(), submit()),
        h("poll-until-done", run(f"{PY} poll.py"), run(f"{PY} poll.py"), run(f"{PY} poll.py"), *FINISH),
        h("poll-six-times", *(run(f"{PY} poll.py"),) * 6, *FINISH, note="baselines stop a poll whose output changes"),
        h("poll-elapsed-time", *(run(f"{PY} install.py"),) * 5, *FINISH,
          note="only the elapsed time changes until the 5th look: reminders, never a stop"),
        h("read-many-files", *(read(f"lib/m{i}.py") for i in range(1, 7)), read("notes.txt"), read(), *FINISH),
        h("ls-while-creating", ls(), write("a.txt", "a"), ls(), write("b.txt", "b"), ls(), write("c.txt", "c"), ls(), *FINISH),
        h("search-after-write", call("search", {"pattern": "hello"}), write("hello.txt", "hello\n"),
          call("search", {"pattern": "hello"}), *FINISH),
        h("alternate-reads-with-edits", read(), read("notes.txt"), fix("'helo'", "'hallo'"), read(), read("notes.txt"),
          fix("'hallo'", "'hello'"), read(), read("notes.txt"), check(), submit()),
        h("retry-flaky-command", run(f"{PY} flaky.py"), run(f"{PY} flaky.py"), *FINISH),
        h("two-wrong-guesses", read("src/greet.py"), read("app/greet.py"), ls(), read(), *FINISH),
        h("prose-then-work", say("I will read the file first."), read(), *FINISH),
        h("recheck-after-each-edit", check(), fix("'helo'", "'helo '"), check(), fix("'helo '", "'helo'"), check(), fix(), check(), submit()),
        h("guess-paths-then-find", read("src/greet.py"), read("lib/greet.py"), ls(), read("app/greet.py"),
          read("greet/greet.py"), ls("lib"), read(), *FINISH, note="failures between new results"),
        h("failed-edit-reread-fix", read(), fix("'hi'", "'hello'"), read(), fix("'Helo'", "'hello'"), read(), *FINISH,
          note="two failed edits with the same read between, then the right one"),
        h("duplicate-burst-then-fix", calls(*[("read_file", {"path": "greet.py"})] * 4), *FINISH,
          note="one answer with four copies of one read: a many-calls warning, no stop"),
        h("duplicate-failures-then-fix", calls(("run_check", {}), ("run_check", {})),
          calls(("read_file", {"path": "src/greet.py"}), ("read_file", {"path": "src/greet.py"})), ls(), *FINISH,
          note="each failing call sent twice in its answer: two failures, not four"),
        h("diagnose-before-fix", check(), run(f"{PY} -c 'import greet; assert greet.greet() == \"hello\", greet.greet()'"),
          run("grep -rn 'def farewell' ."), run("grep -rn 'import string' ."), run("ls no_such_folder"),
          run("grep -rn 'Hello' greet.py"), *FINISH, note="six failing commands, each with a new output: diagnosis, not a struggle"),
        h("probe-tools-after-fix", read(), fix(), check(),
          *(run(c) for c in ("no_such_pytest -q", "which no_such_ruff", f"{PY} -c 'import no_such_hypothesis'",
                             "no_such_ruff check .", "no_such_mypy greet.py", "no_such_flake8 greet.py")), submit(),
          note="the check passed; six tools that are not installed must not roll the fix back"),
        h("page-long-path-file", *(call("read_file", {"path": LONG_PATH, "start_line": s}) for s in (1, 101, 201, 301)),
          *FINISH, note="four different pages, one long path"),
        h("context-under-warning", *(call("read_file", {"path": f"lib/m{i}.py"}, prompt_tokens=10_000 * i) for i in range(1, 7)), *FINISH),
    ]


def library() -> list[Trajectory]:
    return _struggles() + _healthy()
