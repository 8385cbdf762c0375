"""The morning report and the step summary show model-chosen text; a terminal or a browser must not obey it."""

from __future__ import annotations

import socket
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest

from orchestrator.scripted import call, say
from tests.test_night import a_persons_edit_kept_by_the_next_night, overnight, report_json

# A tool name that, printed raw on a terminal, redraws the failed task's line as succeeded and hides the rest.
SPOOF = "x\r\x1b[2K\u2714 t1: succeeded \u00b7 overnight/t1 \u00b7 1 iteration(s)\x1b[K\x1b[8m"
TASKS = [{"name": "t1", "prompt": "p", "check": "false"}]

# A user guard that stops the model and quotes its prose in the signal, as it is: text no built-in guard shortened.
ECHO_GUARD = '''
from orchestrator.errors import QualityError


class Echo:
    def after_model_response(self, ctx, response, calls):
        if response.text:
            raise QualityError("echo", "Call a tool.", message=response.text)
'''
PROSE = "\r\x1b[2K\u2714 t1: succeeded\n\u202e<!-- \x00\x85\x7f" + "".join(f"{i:05d} " for i in range(2500))


def git_counted(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """An environment whose `git` writes its subcommand to the returned file, then runs the real git."""
    import os
    import shutil

    asked = tmp_path / "git-commands"
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "git").write_text(f'#!/bin/sh\necho "$1" >> {asked}\nexec {shutil.which("git")} "$@"\n')
    (shim / "git").chmod(0o755)
    return asked, {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"}


def text_report(config: Path, capsys: Any) -> str:
    capsys.readouterr()
    assert overnight("report", "--config", str(config)) == 0
    return capsys.readouterr().out


def assert_shown_not_obeyed(text: str) -> None:
    for number, line in enumerate(text.split("\n")):
        assert line.isprintable(), f"line {number}: {line[:300]!r}"
        assert len(line) < 400, f"line {number} is {len(line)} characters"


@pytest.fixture
def berlin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process on Berlin's clock (TZ, read again by the C library), and back on its own after."""
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def closed_port() -> int:
    """A port on this host nothing listens on: a model endpoint there refuses every connection."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def echo_guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"echo_guard_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(ECHO_GUARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{name}:Echo"
    sys.modules.pop(name, None)


class TestTextReport:
    def test_a_tool_name_cannot_redraw_a_failed_task_as_succeeded(self, config_file, server, capsys):
        """The unknown tool's name is shown escaped on the failed task's own line, and nothing reads "succeeded" first."""
        config = config_file(tasks=TASKS, night={"max_iterations": 1})
        server.enqueue(call(SPOOF, {}), call(SPOOF, {}))
        assert overnight("run", "--config", str(config)) == 1
        text = text_report(config, capsys)
        assert_shown_not_obeyed(text)
        task_line = text.split("\n")[3]  # after the header and the tally
        assert task_line.startswith("✖ t1: failed (unknown_tool)") and "\\r\\x1b[2K" in task_line

    def test_control_characters_from_any_signal_are_escaped_and_long_messages_cut(
        self, config_file, server, capsys, echo_guard
    ):
        """A user guard's raw message (\\r, ESC, NUL, newline, C1, DEL, bidi override, 15,000 chars) is escaped and cut
        in the text report, and given whole in --json."""
        config = config_file(tasks=TASKS, night={"max_iterations": 1}, guards={"custom": [echo_guard]})
        server.enqueue(say(PROSE))
        assert overnight("run", "--config", str(config)) == 1
        text = text_report(config, capsys)
        assert_shown_not_obeyed(text)
        assert "echo: \\r\\x1b[2K✔ t1: succeeded\\n\\u202e<!-- \\x00\\x85\\x7f00000 00001" in text
        # --json is the contract: JSON escapes the text itself, so the message stays whole and unchanged.
        signals = report_json(config, capsys)["tasks"][0]["iterations"][0]["signals"]
        assert {"level": "severe", "kind": "echo", "message": PROSE} in signals


class TestNotesCommand:
    def test_what_the_models_code_wrote_into_notes_md_is_shown_not_obeyed(self, config_file, server, capsys):
        """Code of the model's that the check runs appends a clipboard write, a screen clear and a carriage return to
        notes.md: `overnight notes`, whole and for the task, shows them escaped."""
        writes_notes = (
            "import os\nwith open(os.path.join('..', '..', 'notes.md'), 'a') as f:\n"
            "    f.write('\\x1b]52;c;ZXZpbA==\\x07\\x1b[2J\\r\\u2714 fix-greet: succeeded\\n')\n"
            "def greet():\n    return 'helo'\n"
        )
        attempt = [call("write_file", {"path": "greet.py", "content": writes_notes}), call("submit", {"summary": "done"})]
        config = config_file(night={"max_iterations": 2})
        server.enqueue(*attempt, *attempt)
        assert overnight("run", "--config", str(config)) == 1
        for args in ([], ["--task", "fix-greet"]):
            capsys.readouterr()
            assert overnight("notes", "--config", str(config), *args) == 0
            shown = capsys.readouterr().out
            assert_shown_not_obeyed(shown)
            assert "\\x1b]52;c;ZXZpbA==\\x07\\x1b[2J\\r✔ fix-greet: succeeded" in shown


class TestStepSummary:
    def test_a_paused_task_is_marked_apart_from_a_parked_one(self):
        """A paused task's row is marked 🔁 (worked again next night), a parked one's ⏸️: told apart without the words."""
        from orchestrator.ci_summary import step_summary
        from tests.test_junit import view

        rows = [line for run in (view("paused", "model_unreachable"), view("parked", "parked")) for line in step_summary(run).split("\n")
                if line.startswith("| t |")]
        assert [row.split(" | ")[1] for row in rows] == ["🔁 paused", "⏸️ parked"]

    def test_a_succeeded_tasks_worst_signal_is_its_committed_iterations_as_in_the_report(self):
        """A task whose first iteration a guard stopped and whose second committed with a warning: its row shows that
        warning, as the text report's badge does, not the stop before it."""
        from orchestrator.ci_summary import step_summary
        from orchestrator.records import Level, Signal
        from tests.test_junit import view

        run = view("succeeded", "", signal_message="loop")
        stopped = replace(run.tasks[0].iterations[0], reason="repeated_tool_call", signals=(Signal(Level.SEVERE, "repeated_tool_call", "loop"),))
        committed = replace(stopped, id=2, number=2, outcome="committed", reason="", signals=(Signal(Level.WARNING, "context_full", "85%"),))
        task = replace(run.tasks[0], iterations=(stopped, committed))
        [row] = [line for line in step_summary(replace(run, tasks=(task,))).split("\n") if line.startswith("| t |")]
        assert row.split(" | ")[4] == "warning `context_full`: 85%"

    def test_control_characters_and_html_in_a_signal_stay_inside_their_cell(
        self, config_file, server, tmp_path, monkeypatch, echo_guard
    ):
        """The task's row is one short line of printable text; `<!--` cannot comment out the rest of the page."""
        summary = tmp_path / "summary.md"
        monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
        config = config_file(tasks=TASKS, night={"max_iterations": 1}, guards={"custom": [echo_guard]})
        server.enqueue(say(PROSE))
        assert overnight("run", "--config", str(config)) == 1
        [row] = [line for line in summary.read_text().split("\n") if line.startswith("| t1 |")]
        assert row.isprintable() and "<" not in row and "&lt;\\!--" in row
        assert row.count(" | ") == 5 and row.endswith(" |") and len(row) < 500



class TestTaskAndIterationLines:
    def test_a_badge_shows_the_worst_signal_and_names_the_others(self):
        """Three signals on one iteration: the severe one is shown with its message, the two warnings beside it by kind."""
        from dataclasses import replace

        from orchestrator.records import Level, Signal
        from orchestrator.report import as_text
        from tests.test_junit import view

        run = view("failed", "check_failed")
        signals = (Signal(Level.WARNING, "dead_loop", "circling"), Signal(Level.SEVERE, "check_failed", "exit 1"),
                   Signal(Level.WARNING, "context_full", "context 85% full"))
        iteration = replace(run.tasks[0].iterations[0], signals=signals)
        text = as_text(replace(run, tasks=(replace(run.tasks[0], iterations=(iteration,)),)))
        assert "    #1 rolled_back check_failed · 2 turns · 10 tokens · ✖ check_failed: exit 1 · also ⚠ dead_loop, context_full" in text.splitlines()

    def test_a_badge_counts_each_other_kind_most_severe_first_and_stops_after_four(self):
        """Nine other signals of seven kinds: a kind seen three times says ×3, the severe one comes before the warnings,
        and past four kinds the rest are counted as `+3 more kinds`, on the task's line and the iteration's alike."""
        from dataclasses import replace

        from orchestrator.records import Level, Signal
        from orchestrator.report import as_text
        from tests.test_junit import view

        run = view("failed", "check_failed")
        kinds = ["unknown_tool_call", "repeated_tool_call", "repeated_tool_call", "dead_loop", "repeated_tool_call",
                 "context_full", "slow"]
        signals = (*[Signal(Level.WARNING, kind, "m") for kind in kinds], Signal(Level.SEVERE, "max_turns", "30 turns"),
                   Signal(Level.WARNING, "bad_json", "m"), Signal(Level.SEVERE, "check_failed", "exit 1"))
        iteration = replace(run.tasks[0].iterations[0], signals=signals)
        lines = as_text(replace(run, tasks=(replace(run.tasks[0], iterations=(iteration,)),))).splitlines()
        badge = (" · ✖ check_failed: exit 1 · also ✖ max_turns, ⚠ repeated_tool_call ×3, unknown_tool_call, dead_loop,"
                 " +3 more kinds")
        assert lines[3].endswith(" · 1 iteration" + badge) and lines[4].endswith(" · 10 tokens" + badge)

    def test_the_references_example_report_is_what_that_night_prints(self):
        """docs/reference.md's example `overnight report` is, to the byte, what the night it describes prints: its kinds
        and messages are the code's (it showed `unknown_tool_call`, no kind, and `check_failed: exit 1`)."""
        import re
        from datetime import timedelta
        from zoneinfo import ZoneInfo

        from orchestrator.records import Level, Signal
        from orchestrator.report import as_text
        from runs.views import IterationView, RunView, TaskView

        reference = (Path(__file__).parent.parent / "docs" / "reference.md").read_text(encoding="utf-8")
        [example] = re.findall(r"### `overnight report`\n\n```\n(.*?)```", reference, re.DOTALL)
        start = datetime(2026, 12, 6, 0, 30, tzinfo=timezone.utc)  # 01:30 CET
        tip = "3f2a9c01be" * 4

        def iteration(number: int, outcome: str, reason: str, turns: int, tokens: int, *signals: Signal) -> IterationView:
            commit = tip if outcome == "committed" else ""
            return IterationView(id=number, task_run_id=1, task_name="t", number=number, outcome=outcome, reason=reason,
                                 correction="", checkpoint="c", commit=commit, turns=turns, tokens=tokens, transcript="", pid=1,
                                 started_at=start, finished_at=start, signals=signals)

        loop = [Signal(Level.WARNING, "repeated_tool_call", "loop: read_file ×3")] * 3
        max_turns = Signal(Level.SEVERE, "max_turns", "max turns: 30")
        unknown = Signal(Level.WARNING, "unknown_tool", "unknown tool: run")
        check_failed = Signal(Level.SEVERE, "check_failed", "check failed: exit 1")  # as orchestrator/iteration.py words it
        done = TaskView(id=1, name="fix-greet", branch="overnight/fix-greet", outcome="succeeded", reason="", commit=tip,
                        iterations=(iteration(1, "committed", "", 7, 9120),))
        failed = TaskView(id=2, name="add-cli", branch="overnight/add-cli", outcome="failed", reason="check_failed", commit="",
                          iterations=(iteration(1, "rolled_back", "max_turns", 30, 25800, *loop, max_turns),
                                      iteration(2, "rolled_back", "check_failed", 1, 6290, unknown, check_failed)))
        night = RunView(id=7, started_at=start, finished_at=start + timedelta(hours=4, minutes=28), status="finished",
                        exit_code=1, tasks=(done, failed))
        assert as_text(night, "main", zone=ZoneInfo("Europe/Berlin")) == example

    def test_one_turn_one_token_and_one_iteration_are_said_in_the_singular(self):
        """A night of one iteration of one turn that spent one token reads `1 iteration`, `1 turn`, `1 token`, not `1 turns`."""
        from dataclasses import replace

        from orchestrator.report import as_text
        from tests.test_junit import view

        run = view("failed", "check_failed")
        iteration = replace(run.tasks[0].iterations[0], turns=1, tokens=1)
        lines = as_text(replace(run, tasks=(replace(run.tasks[0], iterations=(iteration,)),))).splitlines()
        assert lines[0].endswith(" · 1 token") and lines[3].endswith(" · 1 iteration")
        assert lines[4] == "    #1 rolled_back check_failed · 1 turn · 1 token"

    def test_an_iteration_whose_reason_is_its_outcome_says_it_once(self):
        """A cancelled iteration's line reads `#1 cancelled`, not `#1 cancelled cancelled`."""
        from orchestrator.report import as_text
        from tests.test_junit import view

        lines = as_text(view("cancelled", "cancelled")).splitlines()
        assert "    #1 cancelled · 2 turns · 10 tokens" in lines

    def test_a_parked_task_says_which_stop_parked_it(self):
        """A parked task's line names the reason that stopped its last iterations, not `parked (parked)`."""
        from dataclasses import replace

        from orchestrator.report import as_text
        from tests.test_junit import view

        run = view("parked", "parked")
        first = replace(run.tasks[0].iterations[0], reason="max_turns")
        again = [replace(first, id=n, number=n, reason="check_failed") for n in (2, 3)]
        lines = as_text(replace(run, tasks=(replace(run.tasks[0], iterations=(first, *again)),))).splitlines()
        assert lines[3].startswith("⏸ t: parked (parked: check_failed stopped iterations in a row) · overnight/t · 3 iterations")

    def test_a_paused_task_is_marked_apart_from_a_parked_one(self):
        """A paused task's line is marked ↻ (worked again next night), a parked one's ⏸: told apart without the words."""
        from orchestrator.report import as_text
        from tests.test_junit import view

        assert as_text(view("paused", "model_unreachable")).splitlines()[3].startswith("↻ t: paused (model_unreachable; retried next night)")
        assert as_text(view("parked", "parked")).splitlines()[3].startswith("⏸ t: parked")

    def test_a_paused_task_says_which_endpoint_failed_and_how_with_its_password_hidden(self, tmp_path, repo, capsys):
        """A night whose model endpoint refuses connections: the paused task's line names the endpoint, its password as
        ***, and the error, and says it is retried next night; --json's reason stays the code."""
        from tests.conftest import write_config

        port = closed_port()
        config = write_config(tmp_path / "overnight.toml", api_base=f"http://robot:hunter2hunter2@127.0.0.1:{port}/v1", repo=repo)
        assert overnight("run", "--config", str(config)) == 3
        [line] = [line for line in text_report(config, capsys).splitlines() if line.startswith("↻ ")]
        assert line.startswith(f"↻ fix-greet: paused (model_unreachable: model endpoint http://robot:***@127.0.0.1:{port}/v1 (")
        assert "failed 2 times; last error: " in line and line.split(" · ")[0].endswith("; retried next night)")
        assert "hunter2" not in line
        assert report_json(config, capsys)["tasks"][0]["reason"] == "model_unreachable"

    def test_the_second_line_counts_the_night_as_the_exit_code_does(self):
        """Under the header, one line counts the tasks that succeeded (a done-earlier skip among them) and each other
        outcome, and says a paused task's model server could not be reached."""
        from dataclasses import replace

        from orchestrator.report import as_text
        from tests.test_junit import view

        done, paused, parked = view("skipped", "done_earlier_tonight"), view("paused", "model_unreachable"), view("parked", "parked")
        run = replace(done, tasks=(done.tasks[0], paused.tasks[0], parked.tasks[0], parked.tasks[0]))
        assert as_text(run).splitlines()[1] == (
            "1 of 4 task(s) succeeded, 1 paused (the model server could not be reached; no note in notes.md), 2 parked"
        )

    def test_a_task_that_succeeded_after_a_stop_is_not_headed_by_it(self):
        """A task whose first iteration a guard stopped and whose second committed: its line shows no ✖, the stop stays on #1's."""
        from dataclasses import replace

        from orchestrator.records import Level, Signal
        from orchestrator.report import as_text
        from tests.test_junit import view

        run = view("succeeded", "", signal_message="loop")
        stopped = replace(run.tasks[0].iterations[0], reason="repeated_tool_call", signals=(Signal(Level.SEVERE, "repeated_tool_call", "loop"),))
        committed = replace(stopped, id=2, number=2, outcome="committed", reason="", commit="c" * 40, signals=())
        lines = as_text(replace(run, tasks=(replace(run.tasks[0], commit="c" * 40, iterations=(stopped, committed)),))).splitlines()
        assert lines[3] == "✔ t: succeeded · overnight/t @ cccccccccc · 2 iterations"
        assert lines[4] == "    #1 rolled_back repeated_tool_call · 2 turns · 10 tokens · ✖ repeated_tool_call: loop"

    def test_a_run_with_no_tasks_says_so(self):
        """A run that recorded no task (every one skipped before it began) reads `(no tasks ran)`, not a bare header."""
        from dataclasses import replace

        from orchestrator.report import as_text
        from tests.test_junit import view

        assert as_text(replace(view("succeeded"), tasks=())).splitlines()[-1] == "(no tasks ran)"


class TestReviewLines:
    def test_a_task_branch_checked_out_for_review_is_not_what_its_work_is_diffed_against(self, config_file, server, repo, capsys):
        """With `[repo] base` HEAD and the person's checkout on the task's branch, the review line diffs against main, not the branch itself."""
        from tests.conftest import git
        from tests.test_night import FIX

        config = config_file(night={"max_iterations": 1})
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        # The documented way to review in one's own checkout: detach the task's worktree, check the branch out.
        git(config.parent / "state" / "worktrees" / "fix-greet", "switch", "--detach")
        git(repo, "switch", "-q", "overnight/fix-greet")
        review = [line.strip() for line in text_report(config, capsys).splitlines() if "git diff" in line]
        assert review == ["git diff main...overnight/fix-greet"]
        assert git(repo, "diff", "--stat", review[0].split()[-1]) != ""  # the line shows the task's work

    def test_a_task_that_succeeded_with_no_change_has_no_review_line(self, config_file, server, capsys):
        """A task whose check passed as it was, its branch holding nothing `main` lacks, is not under "To review and
        merge": its `git diff` line showed nothing."""
        config = config_file(tasks=[{"name": "t1", "prompt": "p", "check": "true"}], night={"max_iterations": 1})
        server.enqueue(call("submit", {"summary": "nothing to do"}))
        assert overnight("run", "--config", str(config)) == 0
        text = text_report(config, capsys)
        assert "✔ t1: succeeded" in text and "git diff" not in text and "To review and merge" not in text

    def test_a_branch_name_a_shell_misreads_is_quoted_and_the_line_works_as_printed(self, config_file, server, repo, capsys):
        """With `[repo] base` HEAD on the person's branch `fix(12)`, the review line quotes it, and pasted into a shell in
        the repository it shows the task's work (unquoted, bash stopped at a syntax error)."""
        import subprocess

        from tests.conftest import git
        from tests.test_night import FIX

        git(repo, "switch", "-q", "-c", "fix(12)")
        config = config_file(night={"max_iterations": 1})
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        review = [line.strip() for line in text_report(config, capsys).splitlines() if "git diff" in line]
        assert review == ["git diff 'fix(12)'...overnight/fix-greet"]
        pasted = subprocess.run(["bash", "-c", f"{review[0]} --stat"], cwd=repo, capture_output=True, text=True)
        assert pasted.returncode == 0 and "greet.py" in pasted.stdout, pasted.stderr

    def test_a_task_branch_main_shares_no_commit_with_has_a_review_line_that_works(self, config_file, server, repo, capsys):
        """Main's history rewritten in the morning under the task's branch (made anew from one commit): the review line
        compares the two trees, said so, and pasted into a shell it shows the task's work (`main...branch` was git's
        `fatal: no merge base`)."""
        import subprocess

        from tests.conftest import git
        from tests.test_night import FIX

        config = config_file(night={"max_iterations": 1})
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        git(repo, "checkout", "-q", "--orphan", "rewritten")
        git(repo, "commit", "-q", "-m", "history squashed into one commit")
        git(repo, "branch", "-q", "-M", "rewritten", "main")
        review = [line.strip() for line in text_report(config, capsys).splitlines() if "git diff" in line]
        assert review == ["git diff main overnight/fix-greet    # no commit in common with main: the whole trees compared"]
        pasted = subprocess.run(["bash", "-c", review[0].replace("git diff", "git diff --stat", 1)], cwd=repo, capture_output=True, text=True)
        assert pasted.returncode == 0 and "greet.py" in pasted.stdout, pasted.stderr

    def test_a_persons_edits_kept_off_a_worktree_are_named_in_the_report(self, config_file, server, repo, capsys):
        """An edit a person left in the task's worktree, moved by the next night onto an `overnight-kept/` branch before it
        cleaned the worktree: the report names that branch with a line that shows the edit (only a log line said where
        it went, and the morning found it gone from the worktree)."""
        import subprocess

        config = a_persons_edit_kept_by_the_next_night(config_file, server)
        text = text_report(config, capsys).splitlines()
        shown = [line.strip() for line in text[text.index("Changes found in the tasks' worktrees, kept before a night cleaned them (delete each when done):") + 1:]]
        assert len(shown) == 1 and shown[0].startswith("git show overnight-kept/fix-greet/"), text
        pasted = subprocess.run(["bash", "-c", shown[0]], cwd=repo, capture_output=True, text=True)
        assert pasted.returncode == 0 and "+# reviewed: keep the spelling test" in pasted.stdout, pasted.stderr

    def test_kept_branches_named_are_the_newest_and_no_lock_file_is_one(self, config_file, server, repo, capsys):
        """A year of mornings' kept branches (they stay until deleted): the report names the newest twenty and says how
        many older ones it left out (it named every one); the `.lock` a killed git left beside a ref is no branch (it
        was shown as one, and `git show` of it fails)."""
        from tests.conftest import git
        from tests.test_night import FIX

        config = config_file(night={"max_iterations": 1})
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        names = [f"overnight-kept/fix-greet/2026{month:02d}01T000000.000000Z" for month in range(1, 13)]
        names += [f"overnight-kept/fix-greet/202611{day:02d}T000000.000000Z" for day in range(2, 15)]
        for name in names:
            git(repo, "branch", name)
        (repo / ".git" / "refs" / "heads" / "overnight-kept" / "fix-greet" / "20261206T000000.000000Z.lock").write_text("")
        text = text_report(config, capsys).splitlines()
        shown = [line.strip() for line in text[text.index("Changes found in the tasks' worktrees, kept before a night cleaned them (delete each when done):") + 1:]]
        newest = sorted(names)[-20:]
        assert shown == [f"git show {name}" for name in newest] + ["(5 older not shown: git branch --list 'overnight-kept/*')"], shown

    def test_kept_branches_of_a_reftable_repository_are_named(self, config_file, server, repo, tmp_path, capsys):
        """A repository whose refs git keeps in its reftable format (`git init --ref-format=reftable`, git 2.45 on): the
        report names its task's kept branch and no other task's (read by hand from ref files and packed-refs, of which
        such a repository has none, the list was empty)."""
        import subprocess

        from tests.conftest import git, write_config
        from tests.test_night import FIX

        reftable = tmp_path / "reftable"
        made = subprocess.run(["git", "init", "-q", "-b", "main", "--ref-format=reftable", str(reftable)], capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"this git keeps no reftable: {made.stderr.strip()}")
        config = config_file(night={"max_iterations": 1})
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        (reftable / "greet.py").write_text("def greet():\n    return 'hello'\n")
        git(reftable, "add", "greet.py")
        git(reftable, "commit", "-q", "-m", "a person's edit")
        kept = "overnight-kept/fix-greet/20261206T050000.000000Z"
        git(reftable, "branch", kept)
        git(reftable, "branch", "overnight-kept/other-task/20261206T050000.000000Z")
        write_config(config, api_base=server.url, repo=reftable, night={"max_iterations": 1})
        text = text_report(config, capsys).splitlines()
        heading = "Changes found in the tasks' worktrees, kept before a night cleaned them (delete each when done):"
        assert heading in text, text
        assert [line.strip() for line in text[text.index(heading) + 1:]] == [f"git show {kept}"], text

    def test_a_kept_branch_whose_name_is_not_utf8_is_named_with_its_bytes_escaped(self, config_file, server, repo, capsys):
        """A kept branch named with a byte that is not UTF-8 (git takes 0xe9, a Latin-1 `é`): `report --json` is UTF-8 a
        strict parser takes, the byte written `\\udce9` as a file name's is in the tools' output, and so is the text
        report's line (it was a lone surrogate in the JSON, which other languages' parsers refuse, and `?` in the text)."""
        import json
        import subprocess

        from tests.conftest import git
        from tests.test_night import FIX

        config = config_file(night={"max_iterations": 1})
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        git(repo, "branch", "overnight-kept/fix-greet/20261206T050000.000000Z-caf\udce9")  # the byte 0xe9, as os.fsencode gives it
        shown = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "report", "--config", str(config), "--json"],
            capture_output=True, stdin=subprocess.DEVNULL, timeout=60,
        )
        assert shown.returncode == 0, shown.stderr
        report = json.loads(shown.stdout.decode("utf-8", errors="strict"))
        json.dumps(report, ensure_ascii=False).encode("utf-8", errors="strict")  # no lone surrogate, escaped or not
        assert report["kept_branches"] == ["overnight-kept/fix-greet/20261206T050000.000000Z-caf\\udce9"], report
        text = text_report(config, capsys).splitlines()
        assert "  git show 'overnight-kept/fix-greet/20261206T050000.000000Z-caf\\udce9'" in text, text

    def test_a_kept_branch_whose_name_holds_a_line_separator_is_named_whole(self, config_file, server, repo, capsys):
        """A kept branch named with U+2028 or U+0085 (git takes both, as any byte above 0x7f): `report --json` names it
        whole, and the text report shows the character's escape (each was cut in two there, naming a branch there is
        not)."""
        from tests.conftest import git
        from tests.test_night import FIX

        config = config_file(night={"max_iterations": 1})
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        names = [f"overnight-kept/fix-greet/20261206T05000{n}.000000Z-a{separator}b" for n, separator in enumerate("\u2028\x85")]
        for name in names:
            git(repo, "branch", name)
        assert report_json(config, capsys)["kept_branches"] == names
        text = text_report(config, capsys).splitlines()
        heading = "Changes found in the tasks' worktrees, kept before a night cleaned them (delete each when done):"
        assert [line.strip() for line in text[text.index(heading) + 1:]] == [
            "git show 'overnight-kept/fix-greet/20261206T050000.000000Z-a\\u2028b'",
            "git show 'overnight-kept/fix-greet/20261206T050001.000000Z-a\\x85b'",
        ], text

    @pytest.mark.parametrize(
        ("broken", "git_says"), [("another user's", "dubious ownership"), ("a corrupt packed-refs line", "packed-refs")]
    )
    def test_kept_branches_git_cannot_list_are_a_warning_not_none(self, config_file, server, repo, broken, git_says):
        """A repository git refuses to list the refs of (another user's, "dubious ownership"; a corrupt packed-refs
        line): `report` and `report --json` still answer, exit 0, and a `kept_branches_unknown` warning on stderr says
        git's reason (the kept branches were silently none, read as "nothing kept", where the ref files held some)."""
        import json
        import os
        import subprocess

        from tests.conftest import git
        from tests.test_night import FIX

        config = config_file(night={"max_iterations": 1})
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        git(repo, "branch", "overnight-kept/fix-greet/20261206T050000.000000Z")
        env = dict(os.environ)
        if git_says == "dubious ownership":
            env["GIT_TEST_ASSUME_DIFFERENT_OWNER"] = "1"  # git's own switch for its ownership check's tests
        else:
            with (repo / ".git" / "packed-refs").open("a") as packed:
                packed.write("not a ref line\n")
        for json_wanted in (False, True):
            shown = subprocess.run(
                [sys.executable, "-m", "orchestrator.cli", "report", "--config", str(config), *(["--json"] if json_wanted else [])],
                capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60, env=env,
            )
            assert shown.returncode == 0, shown.stderr
            if json_wanted:
                assert json.loads(shown.stdout)["kept_branches"] == [], shown.stdout
            warnings = [json.loads(line) for line in shown.stderr.splitlines()]
            [unknown] = [warning for warning in warnings if warning["event"] == "kept_branches_unknown"]
            assert git_says in unknown["reason"] and unknown["repo"] == str(repo), unknown

    def test_the_branches_the_base_holds_are_asked_of_git_once_for_all_tasks(self, config_file, server, tmp_path):
        """Three tasks succeeded with no change: `overnight report` asks git about their branches in one process, not one
        a task (50 tasks started 50 gits), and leaves out all three review lines."""
        import subprocess

        asked, env = git_counted(tmp_path)
        tasks = [{"name": f"t{number}", "prompt": "p", "check": "true"} for number in (1, 2, 3)]
        config = config_file(tasks=tasks, night={"max_iterations": 1})
        server.enqueue(*[call("submit", {"summary": "nothing to do"})] * 3)
        assert overnight("run", "--config", str(config)) == 0
        shown = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "report", "--config", str(config)], capture_output=True, text=True, env=env, timeout=60
        )
        assert shown.returncode == 0 and "3 of 3 task(s) succeeded" in shown.stdout and "git diff" not in shown.stdout, shown
        about_branches = [line for line in asked.read_text().split() if line in ("merge-base", "for-each-ref", "branch", "rev-list")]
        # One for the branches main holds, one for the tasks' kept branches: two however many the tasks.
        assert about_branches == ["for-each-ref", "for-each-ref"], about_branches
        asked.write_text("")
        as_json = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "report", "--config", str(config), "--json"],
            capture_output=True, text=True, env=env, timeout=60,
        )
        # `--json` asks git only for the tasks' kept branches, once for all three (before it, no git at all).
        about_kept = [line for line in asked.read_text().split() if line in ("for-each-ref", "branch", "rev-list", "show-ref")]
        assert as_json.returncode == 0 and about_kept == ["for-each-ref"], (as_json, asked.read_text())

    def test_branches_main_shares_no_commit_with_are_told_by_as_many_gits_for_any_number_of_tasks(
        self, config_file, server, tmp_path, repo
    ):
        """Main rewritten under three task branches that hold work: `overnight report` tells them apart in a few git
        processes for all, not a `git merge-base` a task (50 tasks, 51 gits), and each line compares the two trees."""
        import subprocess

        from tests.conftest import git

        asked, env = git_counted(tmp_path)
        tasks = [{"name": f"t{number}", "prompt": "p", "check": "true"} for number in (1, 2, 3)]
        config = config_file(tasks=tasks, night={"max_iterations": 1})
        server.enqueue(*[call("submit", {"summary": "nothing to do"})] * 3)
        assert overnight("run", "--config", str(config)) == 0
        for number in (1, 2, 3):
            worktree = config.parent / "state" / "worktrees" / f"t{number}"
            (worktree / "work.txt").write_text(f"task {number}\n")
            git(worktree, "add", "work.txt")
            git(worktree, "commit", "-q", "-m", f"work of task {number}")
        git(repo, "checkout", "-q", "--orphan", "rewritten")
        git(repo, "commit", "-q", "-m", "history squashed into one commit")
        git(repo, "branch", "-q", "-M", "rewritten", "main")
        shown = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "report", "--config", str(config)], capture_output=True, text=True, env=env, timeout=60
        )
        review = [line.strip() for line in shown.stdout.splitlines() if "git diff" in line]
        assert review == [f"git diff main overnight/t{number}    # no commit in common with main: the whole trees compared" for number in (1, 2, 3)], shown
        about_branches = [line for line in asked.read_text().split() if line in ("merge-base", "for-each-ref", "branch", "rev-list", "rev-parse")]
        # The branches main holds, the three that tell those apart, and the tasks' kept branches: one each however many tasks.
        assert "merge-base" not in about_branches and len(about_branches) <= 5, about_branches


class TestTimes:
    def test_times_are_shown_on_the_local_clock_with_its_name(self, berlin):
        """A run that began at 05:00 UTC in December reads `started 2026-12-06 06:00 CET` on a host in Berlin, the
        clock `[night] deadline` is read on."""
        from datetime import timedelta

        from orchestrator.report import as_text
        from tests.test_junit import view

        start = datetime(2026, 12, 6, 5, 0, tzinfo=timezone.utc)
        header = as_text(replace(view("failed", "check_failed"), started_at=start, finished_at=start + timedelta(hours=1))).splitlines()[0]
        assert " · started 2026-12-06 06:00 CET · finished 2026-12-06 07:00 CET · " in header

    def test_a_schedule_timezone_is_the_reports_clock_as_it_is_the_deadlines(self, tmp_path, repo, capsys, berlin):
        """With `[schedule] timezone = "America/New_York"` on a host in Berlin, the report's times are New York's, as the
        deadline is; --json's stay UTC isoformat."""
        from zoneinfo import ZoneInfo

        from tests.conftest import write_config

        new_york = '[schedule]\ntimezone = "America/New_York"\n'
        config = write_config(tmp_path / "overnight.toml", api_base=f"http://127.0.0.1:{closed_port()}/v1", repo=repo, extra=new_york)
        assert overnight("run", "--config", str(config)) == 3
        header = text_report(config, capsys).splitlines()[0]
        started = report_json(config, capsys)["run"]["started_at"]
        assert started.endswith("+00:00")
        in_new_york = datetime.fromisoformat(started).astimezone(ZoneInfo("America/New_York")).strftime("%Y-%m-%d %H:%M %Z")
        assert f" · started {in_new_york} · " in header

    def test_an_unknown_schedule_timezone_is_one_line_and_exit_2_as_run_and_serve_refuse_it(self, tmp_path, repo):
        """`[schedule] timezone = "garbage"` put in after a night: the text report is exit 2 naming the key, not times on
        the host's clock read as the zone asked for; --json, which shows no zone, still answers."""
        from tests.conftest import write_config
        from tests.test_cli import assert_one_line_error, overnight as overnight_process

        config = write_config(tmp_path / "overnight.toml", api_base=f"http://127.0.0.1:{closed_port()}/v1", repo=repo)
        assert overnight("run", "--config", str(config)) == 3
        config.write_text(config.read_text() + '[schedule]\ntimezone = "garbage"\n')
        assert_one_line_error(overnight_process("report", "--config", str(config)), 2, "[schedule] timezone", "'garbage'")
        assert overnight_process("report", "--json", "--config", str(config)).returncode == 0

    @pytest.mark.parametrize("setting", ["Not/AZone", "garbage", "EST24"])
    def test_a_tz_the_c_library_cannot_read_shows_utc_named_so_and_says_why(self, tmp_path, repo, setting):
        """TZ=Not/AZone: the C library's clock is UTC under the name `Not`; the report's times are UTC named `UTC`, and a
        `report_times_in_utc` warning on stderr says why. So for TZ=EST24, an offset of a day, which the night reads in
        UTC as no datetime can hold it."""
        import json
        import os
        import subprocess

        from tests.conftest import write_config

        config = write_config(tmp_path / "overnight.toml", api_base=f"http://127.0.0.1:{closed_port()}/v1", repo=repo)
        assert overnight("run", "--config", str(config)) == 3
        shown = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "report", "--config", str(config)],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60, env={**os.environ, "TZ": setting},
        )
        assert shown.returncode == 0, shown.stderr
        header = shown.stdout.splitlines()[0]
        assert header.count(" UTC · ") == 2 and setting.split("/")[0] not in header, header
        [warning] = [json.loads(line) for line in shown.stderr.splitlines()]
        assert (warning["event"], warning["tz"]) == ("report_times_in_utc", setting)

    @pytest.mark.parametrize(
        ("setting", "unreadable"),
        [
            ("Europe/Berlin", False), (":Europe/Berlin", False), ("UTC0", False), ("EST5EDT", False), ("<+0530>-5:30", False),
            ("", False), (":", False), ("EST+ 5", False), ("EST++5", False), ("EST- +3", False),
            ("Not/AZone", True), (":Not/AZone", True), ("garbage", True), ("AB5", True), ("<>-1", True), ("EST 5", True),
            ("EST+- 5", True),
        ],
    )
    def test_a_tz_is_unreadable_only_where_the_c_library_falls_back_to_utc(self, monkeypatch, setting, unreadable):
        """A zone file (with or without glibc's `:`) and a POSIX rule are read as set, also one whose offset glibc's sscanf
        reads after white space or a second sign (`EST+ 5` is UTC-5 to `date`); a name no zone file has and no rule (too
        short a name, no offset) is the C library's UTC under a made-up name."""
        from orchestrator.cancel import unreadable_tz
        from tests.test_schedule import zone_file

        zone_file("Europe/Berlin")  # skipped on a host without a zone database
        monkeypatch.setenv("TZ", setting)
        assert unreadable_tz() == (setting if unreadable else None)

    def test_a_clock_with_no_name_for_its_time_is_named_by_its_offset(self):
        """A zone whose times have no abbreviation (`%Z` empty, as TZ=`<>-1` gives): the header names the offset,
        `started 2026-12-06 10:30 +0530`, not a bare time."""
        from datetime import timedelta

        from orchestrator.report import as_text
        from tests.test_junit import view

        start = datetime(2026, 12, 6, 5, 0, tzinfo=timezone.utc)
        unnamed = timezone(timedelta(hours=5, minutes=30), "")
        header = as_text(replace(view("failed", "check_failed"), started_at=start, finished_at=start), zone=unnamed).splitlines()[0]
        assert " · started 2026-12-06 10:30 +0530 · finished 2026-12-06 10:30 +0530 · " in header


# A night of two tasks: the first's iteration waits for its answer when the deadline comes, the second never begins.
CUT_TASKS = [
    {"name": "first", "prompt": "p", "check": "python check_greet.py"},
    {"name": "second", "prompt": "p", "check": "python check_greet.py"},
]
IN_UTC = '\n[schedule]\ntimezone = "UTC"\n'


class TestDeadlineLine:
    def test_a_night_the_deadline_cuts_says_when_and_which_tasks_it_cut_or_left_unstarted(self, config_file, server, capsys):
        """A night cut at its 06:30 deadline: under the tally, one line gives the deadline on the report's clock, the task
        it cut short and the one it left unstarted; --json's run has them as `deadline` (its instant in UTC). The morning
        could not tell a night out of time from one that failed, nor when its time ran out."""
        from tests.test_unattended import EDIT_THEN_WAIT, clock_from, run_in_process

        config = config_file(tasks=CUT_TASKS, model={"request_timeout_s": 60}, night={"deadline": "06:30"}, extra=IN_UTC)
        server.enqueue(*EDIT_THEN_WAIT)
        assert run_in_process(config, now=clock_from(datetime(2026, 11, 30, 6, 29, 58, tzinfo=timezone.utc))).exit_code == 1
        lines = text_report(config, capsys).splitlines()
        assert lines[1:4] == ["0 of 2 task(s) succeeded, 2 cancelled", "deadline 2026-11-30 06:30 UTC · cut short: first · not started: second", ""]
        run = report_json(config, capsys)["run"]
        assert run["deadline"] == {"at": "2026-11-30T06:30:00+00:00", "cut_short": ["first"], "not_started": ["second"]}

    def test_a_night_begun_after_its_deadline_says_no_task_started(self, config_file, server, capsys):
        """`overnight run --scheduled-for` (as `serve` runs it) an hour after its fire's deadline starts nothing: the
        report names the deadline that had passed and every task as not started."""
        from datetime import timedelta

        fired = (datetime.now(timezone.utc) - timedelta(hours=2)).replace(second=0, microsecond=0)
        deadline = fired + timedelta(hours=1)
        config = config_file(tasks=CUT_TASKS, night={"deadline": f"{deadline:%H:%M}"}, extra=IN_UTC)
        assert overnight("run", "--config", str(config), "--scheduled-for", fired.isoformat()) == 1
        assert server.requests == []
        assert text_report(config, capsys).splitlines()[2] == f"deadline {deadline:%Y-%m-%d %H:%M} UTC · not started: first, second"
        run = report_json(config, capsys)["run"]
        assert run["deadline"] == {"at": deadline.isoformat(), "cut_short": [], "not_started": ["first", "second"]}

    def test_a_deadline_that_ended_no_task_is_named_and_a_night_without_one_says_nothing(self, config_file, server, capsys):
        """A night done long before its deadline names it, with nothing cut; one with no deadline has no such line, and
        --json's `deadline` is null."""
        from datetime import timedelta

        from tests.test_night import FIX

        # Twelve hours on: no night of this test's comes near it, whatever the hour it runs at.
        clock = f"{datetime.now(timezone.utc) + timedelta(hours=12):%H:%M}"
        config = config_file(night={"deadline": clock}, extra=IN_UTC)
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        deadline = report_json(config, capsys)["run"]["deadline"]
        at = datetime.fromisoformat(deadline["at"])
        assert (f"{at:%H:%M}", at.utcoffset(), deadline["cut_short"], deadline["not_started"]) == (clock, timedelta(0), [], [])
        assert text_report(config, capsys).splitlines()[2] == f"deadline {at:%Y-%m-%d} {clock} UTC · no task cut short or left unstarted by it"
        config = config_file()
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        assert report_json(config, capsys)["run"]["deadline"] is None
        assert text_report(config, capsys).splitlines()[2] == ""

    def test_an_older_versions_store_reports_the_tasks_its_deadline_ended_without_its_time(self, config_file, server, capsys):
        """A store an older version made (its runs without `deadline`): the report opens it, the column added, and still
        names the tasks the deadline ended, from their reasons, its time unknown (`at` null)."""
        import sqlite3

        from tests.test_unattended import EDIT_THEN_WAIT, clock_from, run_in_process

        config = config_file(tasks=CUT_TASKS, model={"request_timeout_s": 60}, night={"deadline": "06:30"}, extra=IN_UTC)
        server.enqueue(*EDIT_THEN_WAIT)
        run_in_process(config, now=clock_from(datetime(2026, 11, 30, 6, 29, 58, tzinfo=timezone.utc)))
        with sqlite3.connect(config.parent / "state" / "runs.db") as db:
            db.execute("ALTER TABLE runs DROP COLUMN deadline")
        db.close()
        assert text_report(config, capsys).splitlines()[2] == "deadline (its time not recorded) · cut short: first · not started: second"
        run = report_json(config, capsys)["run"]
        assert run["deadline"] == {"at": None, "cut_short": ["first"], "not_started": ["second"]}

    def test_a_long_list_of_tasks_the_deadline_ended_stays_one_short_line(self):
        """Forty tasks left unstarted: the line names five and counts the rest; --json names every one."""
        from orchestrator.report import as_json, as_text
        from tests.test_junit import view

        run = view("cancelled", "deadline")
        unstarted = tuple(replace(run.tasks[0], id=n, name=f"task-{n}", iterations=()) for n in range(40))
        run = replace(run, tasks=unstarted, deadline=datetime(2024, 5, 1, 6, 30, tzinfo=timezone.utc))
        line = as_text(run, zone=timezone.utc).splitlines()[2]
        assert line == "deadline 2024-05-01 06:30 UTC · not started: task-0, task-1, task-2, task-3, task-4, +35 more"
        assert len(as_json(run)["run"]["deadline"]["not_started"]) == 40
