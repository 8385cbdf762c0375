"""CI reports from a real night: JUnit XML, the GitHub step summary, and JSON-lines logs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from html import unescape
from pathlib import Path
from typing import Any

import pytest

from orchestrator.build import open_store
from orchestrator.ci_summary import StepSummarySkipped, append_step_summary, step_summary
from orchestrator.config import load_config
from orchestrator.errors import StateError
from orchestrator.fake_server import ScriptedServer
from orchestrator.junit import write_junit
from orchestrator.records import Level, Signal
from orchestrator.scripted import Reply, call
from runs.views import IterationView, RunView, TaskView
from tests.conftest import SAMPLE_FILES, git, make_repo, write_config
from tests.test_night import FIX, a_persons_edit_kept_by_the_next_night, overnight, report_json

TASKS = [
    {"name": "fix-greet", "prompt": "greet() should return 'hello'.", "check": "python check_greet.py"},
    {"name": "never", "prompt": "make false succeed", "check": "false"},
]
# fix-greet succeeds at once; `never` loops on read_file, then submits while its check fails.
SCRIPT = [*FIX, *[call("read_file", {"path": "greet.py"})] * 4, call("submit", {"summary": "done?"})]


def stored_run(config: Path) -> RunView:
    store = open_store(load_config(config))
    try:
        run = store.latest_run()
    finally:
        store.close()
    assert run is not None
    return run


def run_night(folder: Path, script: list[Reply], tasks: list[dict[str, Any]] = TASKS) -> tuple[int, Path, RunView]:
    """Run a real night through the CLI against a scripted server; return exit code, config and the stored run."""
    repo = make_repo(folder / "repo", SAMPLE_FILES)
    with ScriptedServer(script) as server:
        config = write_config(folder / "overnight.toml", api_base=server.url, repo=repo, tasks=tasks)
        code = overnight("run", "--config", str(config), "--log-format", "json")
    return code, config, stored_run(config)


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path, RunView]:
    """One succeeding and one failing task, run once for the whole module."""
    return run_night(tmp_path_factory.mktemp("night"), SCRIPT)


def junit_of(run: RunView, path: Path) -> ET.Element:
    write_junit(run, path)
    return ET.parse(path).getroot()


def case_named(root: ET.Element, name: str) -> ET.Element:
    [case] = [c for c in root.iter("testcase") if c.get("name") == name]
    return case


def view(outcome: str, reason: str = "", *, signal_message: str = "") -> RunView:
    """A stored-run snapshot with one task, for outcomes a scripted night cannot reach cheaply."""
    start = datetime(2024, 5, 1, 1, 30, tzinfo=timezone.utc)
    signals = (Signal(Level.SEVERE, reason or "x", signal_message),) if signal_message else ()
    iteration = IterationView(
        id=1, task_run_id=1, task_name="t", number=1, outcome="cancelled" if outcome == "cancelled" else "rolled_back",
        reason=reason, correction="", checkpoint="c", commit="", turns=2, tokens=10, transcript="", pid=1,
        started_at=start, finished_at=start + timedelta(seconds=3), signals=signals,
    )
    task = TaskView(id=1, name="t", branch="overnight/t", outcome=outcome, reason=reason, commit="",
                    iterations=(iteration,), started_at=start, finished_at=start + timedelta(seconds=4))
    return RunView(id=7, started_at=start, finished_at=start + timedelta(seconds=5), status="finished", exit_code=1, tasks=(task,))


class TestJunitFromARealNight:
    def test_suite_counts_match_the_night(self, night, tmp_path):
        """One <testsuite name="overnight"> counts two tests and one failure, with times that parse."""
        code, _, run = night
        assert code == 1
        root = junit_of(run, tmp_path / "junit.xml")
        assert root.tag == "testsuites"
        [suite] = root.findall("testsuite")
        assert suite.get("name") == "overnight"
        assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("2", "1", "0", "0")
        assert float(suite.get("time")) > 0
        assert [(c.get("classname"), c.get("name")) for c in suite.findall("testcase")] == [("overnight", "fix-greet"), ("overnight", "never")]
        assert all(float(c.get("time")) >= 0 for c in suite.findall("testcase"))

    def test_succeeded_task_passes_with_branch_and_commit(self, night, tmp_path):
        """The succeeding task has no failure, and its system-out names the branch and the committed tip."""
        _, config, run = night
        case = case_named(junit_of(run, tmp_path / "junit.xml"), "fix-greet")
        assert [child.tag for child in case] == ["system-out"]
        tip = git(config.parent / "repo", "rev-parse", "overnight/fix-greet")
        assert case.findtext("system-out") == f"branch: overnight/fix-greet\ncommit: {tip}\n"

    def test_failed_task_carries_reason_codes(self, night, tmp_path):
        """The failure message lists each iteration's reason code; the type is the last; the body lists iterations."""
        _, _, run = night
        failure = case_named(junit_of(run, tmp_path / "junit.xml"), "never").find("failure")
        assert failure is not None
        assert failure.get("message") == "repeated_tool_call, check_failed"
        assert failure.get("type") == "check_failed"
        body = failure.text.splitlines()
        assert body[1].startswith("#1 rolled_back · reason repeated_tool_call · worst signal severe repeated_tool_call")
        assert body[2].startswith("#2 rolled_back · reason check_failed · worst signal severe check_failed")

    def test_a_parked_tasks_type_is_the_reason_that_kept_stopping_it(self, tmp_path):
        """`parked` is the task's own reason; `type` is the last reason code, as for a failed task."""
        import dataclasses

        run = view("failed", "repeated_tool_call")
        run = dataclasses.replace(run, tasks=(dataclasses.replace(run.tasks[0], outcome="parked", reason="parked"),))
        failure = case_named(junit_of(run, tmp_path / "junit.xml"), "t").find("failure")
        assert (failure.get("message"), failure.get("type")) == ("repeated_tool_call", "repeated_tool_call")

    def test_a_parked_tasks_type_is_its_last_iterations_reason_not_the_newest_code(self, tmp_path):
        """Parked after check_failed twice in a row, with a repeated_tool_call before: the type was the newest
        distinct code (repeated_tool_call), not what parked it (found by a review)."""
        import dataclasses

        run = view("failed", "check_failed")
        first = run.tasks[0].iterations[0]
        iterations = tuple(
            dataclasses.replace(first, id=n, number=n, reason=reason)
            for n, reason in enumerate(("check_failed", "repeated_tool_call", "check_failed", "check_failed"), start=1)
        )
        run = dataclasses.replace(run, tasks=(dataclasses.replace(run.tasks[0], outcome="parked", reason="parked", iterations=iterations),))
        failure = case_named(junit_of(run, tmp_path / "junit.xml"), "t").find("failure")
        assert (failure.get("message"), failure.get("type")) == ("check_failed, repeated_tool_call", "check_failed")

    def test_a_parked_tasks_body_says_which_stop_parked_it(self, tmp_path):
        """The failure body's first line reads `t: parked (parked: check_failed stopped iterations in a row)`, not `parked (parked)`."""
        import dataclasses

        run = view("failed", "check_failed")
        run = dataclasses.replace(run, tasks=(dataclasses.replace(run.tasks[0], outcome="parked", reason="parked"),))
        failure = case_named(junit_of(run, tmp_path / "junit.xml"), "t").find("failure")
        assert failure.text.splitlines()[0] == "t: parked (parked: check_failed stopped iterations in a row)"

    def test_rewrite_is_atomic_and_leaves_no_temporary_file(self, night, tmp_path):
        """Writing over an old report replaces it whole and leaves only the report in the folder."""
        _, _, run = night
        target = tmp_path / "junit.xml"
        target.write_text("old, not xml")
        junit_of(run, target)
        assert [p.name for p in tmp_path.iterdir()] == ["junit.xml"]

    def test_a_report_written_over_keeps_a_mode_the_umask_would_not_give(self, tmp_path):
        """0600 (a CI that keeps its reports private) stays 0600: with the umask's 0644 the old test could not tell."""
        target = tmp_path / "junit.xml"
        target.write_text("old")
        target.chmod(0o600)
        junit_of(view("failed", "check_failed"), target)
        assert target.stat().st_mode & 0o777 == 0o600

    def test_unwritable_target_is_a_state_error(self, night, tmp_path):
        """A report path under a regular file fails with StateError naming the path."""
        _, _, run = night
        (tmp_path / "file").write_text("")
        with pytest.raises(StateError, match="cannot write JUnit report"):
            write_junit(run, tmp_path / "file" / "junit.xml")


class TestJunitOutcomes:
    def test_paused_task_is_an_error(self, tmp_path):
        """A task paused because the endpoint refused (401) is an <error>, not a failure."""
        code, _, run = run_night(tmp_path, [Reply(status=401)], tasks=TASKS[:1])
        assert code == 3
        root = junit_of(run, tmp_path / "junit.xml")
        error = case_named(root, "fix-greet").find("error")
        assert error is not None and error.get("message") == "model_unreachable"
        assert root.find("testsuite").get("errors") == "1"

    def test_a_paused_tasks_error_says_which_endpoint_refused_and_how(self, tmp_path):
        """The <error>'s body names the endpoint that answered 401 and says the task is worked again next night."""
        code, config, run = run_night(tmp_path, [Reply(status=401)], tasks=TASKS[:1])
        assert code == 3
        error = case_named(junit_of(run, tmp_path / "junit.xml"), "fix-greet").find("error")
        api_base = load_config(config).model.api_base
        first_line = error.text.splitlines()[0]
        endpoint = f"model endpoint {api_base} (openai/scripted)"
        assert first_line.startswith(f"fix-greet: paused (model_unreachable: {endpoint} refused the request (401)")
        assert first_line.endswith("; retried next night)")

    def test_cancelled_task_is_skipped(self, tmp_path):
        """A cancelled task is <skipped message="cancelled">."""
        root = junit_of(view("cancelled", "cancelled"), tmp_path / "junit.xml")
        skipped = case_named(root, "t").find("skipped")
        assert skipped is not None and skipped.get("message") == "cancelled"
        assert root.find("testsuite").get("skipped") == "1"

    def test_task_leased_by_another_worker_is_skipped(self, tmp_path):
        """A task another machine is working on is <skipped message="leased">, not an error of this night."""
        root = junit_of(replace(view("skipped", "leased"), tasks=(replace(view("skipped", "leased").tasks[0], iterations=()),)), tmp_path / "junit.xml")
        skipped = case_named(root, "t").find("skipped")
        assert skipped is not None and skipped.get("message") == "leased"
        suite = root.find("testsuite")
        assert (suite.get("skipped"), suite.get("errors"), suite.get("failures")) == ("1", "0", "0")

    def test_task_interrupted_by_a_crash_is_an_error_not_a_failure(self, tmp_path):
        """`interrupted` (the night died under the task) is not the task's fault: an <error>."""
        root = junit_of(view("failed", "interrupted"), tmp_path / "junit.xml")
        case = case_named(root, "t")
        assert case.find("failure") is None and case.find("error").get("message") == "interrupted"
        suite = root.find("testsuite")
        assert (suite.get("errors"), suite.get("failures")) == ("1", "0")

    def test_control_characters_from_the_model_stay_valid_xml_and_show_what_was_there(self, tmp_path):
        """Escape codes, NULs, a carriage return, a lone surrogate and U+FFFF in a signal message are written as their
        escapes, as `overnight report` shows them (they were all U+FFFD, so nobody could tell an ESC from a NUL), and the
        file parses."""
        run = view("failed", "runaway_output", signal_message="\x1b[31mred\x00 a\rb \ud800 \uffff ]]> <!-- &")
        failure = case_named(junit_of(run, tmp_path / "junit.xml"), "t").find("failure")
        assert "\\x1b[31mred\\x00 a\\rb \\ud800 \\uffff ]]> <!-- &" in failure.text, failure.text
        assert "\ufffd" not in (tmp_path / "junit.xml").read_text(encoding="utf-8")

    def test_a_control_character_in_a_paused_tasks_detail_is_its_escape_too(self, tmp_path):
        """A paused task's reason detail with an ESC shows it as `\\x1b` in the error's body."""
        paused = view("paused", "model_unreachable")
        run = replace(paused, tasks=(replace(paused.tasks[0], detail="endpoint said \x1b[2Jhi\x07"),))
        error = case_named(junit_of(run, tmp_path / "junit.xml"), "t").find("error")
        assert "endpoint said \\x1b[2Jhi\\x07" in error.text, error.text

    def test_a_control_character_in_an_attribute_is_its_escape_and_its_line_breaks_and_tabs_stay(self, tmp_path):
        """The host name and config path are attributes, where an XML reader turns a raw tab or line break into a
        space: they are written as `&#09;` and `&#10;`, and an ESC as `\\x1b`, as in a text node."""
        run = replace(view("failed", "check_failed"), host="box\x1b[2J\none\ttwo", config_path="/srv/a\nb\x00/o.toml")
        suite = junit_of(run, tmp_path / "junit.xml").find("testsuite")
        assert suite.get("hostname") == "box\\x1b[2J\none\ttwo", suite.get("hostname")
        assert suite.find("properties/property[@name='config']").get("value") == "/srv/a\nb\\x00/o.toml"

    def test_task_left_running_is_an_error(self, tmp_path):
        """A task still `running` (its night died) is reported as an error, not a pass."""
        run = view("running")
        run = replace(run, tasks=(replace(run.tasks[0], finished_at=None),))
        error = case_named(junit_of(run, tmp_path / "junit.xml"), "t").find("error")
        assert error is not None and error.get("message") == "task left running"


    def test_the_suite_properties_name_the_run_and_keep_an_exit_code_of_0(self, tmp_path):
        """The <properties> carry run_id, status and exit_code, an exit code 0 (a night that succeeded) included."""
        run = replace(view("succeeded"), exit_code=0, config_path="/etc/overnight.toml")
        properties = junit_of(run, tmp_path / "junit.xml").find("testsuite").find("properties")
        named = {p.get("name"): p.get("value") for p in properties.findall("property")}
        assert named == {"run_id": "7", "status": "finished", "exit_code": "0", "config": "/etc/overnight.toml"}

    def test_a_task_whose_end_another_clock_put_before_its_start_takes_no_negative_time(self, tmp_path):
        """A finish stamped earlier than the start (machines sharing a store, clocks apart) is 0 seconds, not negative."""
        run = view("failed", "check_failed")
        task = run.tasks[0]
        run = replace(run, tasks=(replace(task, finished_at=task.started_at - timedelta(seconds=2)),))
        assert case_named(junit_of(run, tmp_path / "junit.xml"), "t").get("time") == "0.000"


class TestStepSummary:
    def test_summary_is_appended_never_overwritten(self, night, tmp_path):
        """An existing step summary keeps its text, and the night's table follows it."""
        _, _, run = night
        target = tmp_path / "summary.md"
        target.write_text("# earlier step\n")
        assert append_step_summary(run, target) is True
        text = target.read_text()
        assert text.startswith("# earlier step\n")
        assert f"## overnight run #{run.id}: 1/2 task(s) succeeded" in text
        assert "notes.md:" in text

    def test_rows_hold_outcome_reason_iterations_signal_and_branch(self, night, tmp_path):
        """Each task is one row: name, outcome, reason, iteration count, worst signal, branch and commit."""
        _, _, run = night
        target = tmp_path / "summary.md"
        append_step_summary(run, target)
        rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in target.read_text().splitlines() if line.startswith("| ")}
        assert rows["never"][1:4] == ["❌ failed", "`check_failed`", "2"]
        assert rows["never"][4].startswith("severe `check_failed`")
        assert rows["fix-greet"][1:4] == ["✅ succeeded", "", "1"]
        assert rows["fix-greet"][5].startswith("`overnight/fix-greet` @ `")

    def test_environment_variable_selects_the_file(self, night, tmp_path, monkeypatch):
        """With $GITHUB_STEP_SUMMARY set the summary goes there; unset, nothing is written."""
        _, _, run = night
        target = tmp_path / "step.md"
        monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
        assert append_step_summary(run) is False
        monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(target))
        assert append_step_summary(run) is True
        assert "| never |" in target.read_text()

    def test_a_named_pipe_nobody_reads_is_refused_not_waited_on(self, night, tmp_path):
        """Opening it to append blocked until a reader came: the night's end, and its lock, held for ever."""
        import threading

        _, _, run = night
        target = tmp_path / "summary.pipe"
        os.mkfifo(target)
        outcome: list[BaseException | bool] = []

        def append() -> None:
            try:
                outcome.append(append_step_summary(run, target))
            except BaseException as error:
                outcome.append(error)

        writer = threading.Thread(target=append, daemon=True)
        writer.start()
        writer.join(5)
        assert not writer.is_alive()
        [error] = outcome
        assert isinstance(error, StateError) and "summary.pipe" in str(error)

    def test_a_slow_reader_of_a_named_pipe_gets_all_of_a_long_summary(self, tmp_path):
        """Left non-blocking after its open, the write stopped at a full pipe (64 KiB): the table cut off."""
        one = view("failed", "loop", signal_message="x" * 150)
        run = replace(one, tasks=tuple(replace(one.tasks[0], id=n, name=f"task-{n}") for n in range(1000)))
        target = tmp_path / "summary.pipe"
        os.mkfifo(target)
        notes = tmp_path / "notes.md"
        reader = subprocess.Popen(["sh", "-c", 'exec 3<"$1"; sleep 1; wc -c <&3', "sh", str(target)], stdout=subprocess.PIPE, text=True)
        try:
            expected = len(step_summary(run, notes=notes).encode("utf-8"))
            assert expected > 2 * 65536
            deadline = datetime.now() + timedelta(seconds=10)
            while datetime.now() < deadline:
                try:
                    append_step_summary(run, target, notes=notes)
                    break
                except StateError:  # the reader has yet to open it
                    pass
            out, _ = reader.communicate(timeout=10)
        finally:
            reader.kill()
        assert int(out) == expected

    def test_a_named_pipe_someone_reads_gets_the_summary(self, night, tmp_path):
        _, _, run = night
        target = tmp_path / "summary.pipe"
        os.mkfifo(target)
        reader = subprocess.Popen(["cat", str(target)], stdout=subprocess.PIPE, text=True)
        try:
            deadline = datetime.now() + timedelta(seconds=10)
            while datetime.now() < deadline:  # until cat has the pipe open: then writing needs no wait
                try:
                    assert append_step_summary(run, target) is True
                    break
                except StateError:
                    pass
            out, _ = reader.communicate(timeout=10)
        finally:
            reader.kill()
        assert f"## overnight run #{run.id}" in out

    def test_only_succeeded_tasks_count_as_succeeded(self, tmp_path):
        """A cancelled, a skipped and a failed task: 0 of 3 succeeded, not 2 (nothing but `succeeded` is a success)."""
        one = view("failed", "check_failed").tasks[0]
        tasks = tuple(replace(one, id=n, name=name, outcome=outcome, reason=reason) for n, (name, outcome, reason) in
                      enumerate([("a", "cancelled", "cancelled"), ("b", "skipped", "leased"), ("c", "failed", "check_failed")], start=1))
        target = tmp_path / "summary.md"
        append_step_summary(replace(view("failed"), tasks=tasks), target)
        assert "## overnight run #7: 0/3 task(s) succeeded (finished, exit 1)" in target.read_text()

    def test_a_task_done_earlier_tonight_counts_as_succeeded_in_the_heading(self, tmp_path):
        """A scheduled night begun again (serve restarted) skips the task its fire's earlier run finished
        (`done_earlier_tonight`) and exits 0: the heading said "0/1 task(s) succeeded (finished, exit 0)"
        (found by an outside review)."""
        repo = make_repo(tmp_path / "repo", SAMPLE_FILES)
        summary, fire = tmp_path / "summary.md", datetime.now(timezone.utc).isoformat()
        with ScriptedServer(FIX) as server:
            config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo)
            for _ in range(2):  # the night, then the same night begun again
                done = subprocess.run(
                    [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--log-format", "json", "--scheduled-for", fire],
                    capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120,
                    env={**os.environ, "GITHUB_STEP_SUMMARY": str(summary)},
                )
                assert done.returncode == 0, done.stderr
        headings = [line for line in summary.read_text().splitlines() if line.startswith("## ")]
        assert [heading.split(": ", 1)[1] for heading in headings] == ["1/1 task(s) succeeded (finished, exit 0)"] * 2
        assert "| fix-greet | ⏭️ skipped | `done_earlier_tonight` | 0 |" in summary.read_text()

    def test_a_task_done_elsewhere_counts_as_succeeded_in_the_heading(self, tmp_path):
        """A task another worker sharing the store finished (`done_elsewhere`) is a success, as the exit code 0 says:
        each of two machines sharing a night said "1/2 task(s) succeeded (finished, exit 0)" (found by an outside review)."""
        one = view("succeeded").tasks[0]
        tasks = tuple(replace(one, id=n, name=name, outcome=outcome, reason=reason) for n, (name, outcome, reason) in
                      enumerate([("a", "succeeded", ""), ("b", "skipped", "done_elsewhere")], start=1))
        target = tmp_path / "summary.md"
        append_step_summary(replace(view("succeeded"), exit_code=0, tasks=tasks), target)
        assert "## overnight run #7: 2/2 task(s) succeeded (finished, exit 0)" in target.read_text()

    def test_the_summary_says_where_notes_md_is(self):
        """The night's own notes.md by its path; without one known, the artifact a CI job keeps."""
        run = view("failed", "check_failed")
        assert "`/srv/state/notes.md` (or `overnight notes`)" in step_summary(run, notes=Path("/srv/state/notes.md"))
        assert "the `notes.md` artifact (or `overnight notes`)" in step_summary(run)

    @pytest.mark.parametrize(("notes", "shown"), [
        ("/srv/a`b``c/notes.md", "```/srv/a`b``c/notes.md```"),
        ("/srv/`x`/notes.md", "``/srv/`x`/notes.md``"),
        ("`srv/notes.md", "`` `srv/notes.md ``"),
        ("/srv/a\nb/notes.md", "`/srv/a\\nb/notes.md`"),
        ("/srv/a|b <!-- c/notes.md", "`/srv/a|b <!-- c/notes.md`"),
    ])
    def test_a_notes_path_stays_one_code_span_on_the_notes_line(self, notes, shown):
        """A `[state] dir` holding a backtick ended the code span early, the rest rendered as markdown; a line break
        split the notes line in two. The fence is one backtick longer than the path's longest run of them."""
        text = step_summary(view("failed", "check_failed"), notes=Path(notes))
        [line] = [line for line in text.splitlines() if line.startswith("notes.md:")]
        assert line.endswith(f": {shown} (or `overnight notes`)."), line

    @pytest.mark.parametrize("notes", [
        "/srv/a`b``c/notes.md", "`/notes.md", "/srv/notes.md`", "```", " /srv/notes.md ", " `srv` ", "  ",
        "/srv/a|b <!-- c/notes.md",
    ])
    def test_a_notes_path_renders_as_itself(self, notes):
        """Rendered by a CommonMark parser, the notes line's code span holds the path as it is: one that begins and
        ends with a space lost both (CommonMark strips one each side), ` `srv` ` became `srv`."""
        markdown_it = pytest.importorskip("markdown_it")
        text = step_summary(view("failed", "check_failed"), notes=Path(notes))
        [line] = [line for line in text.splitlines() if line.startswith("notes.md:")]
        html = markdown_it.MarkdownIt("commonmark").renderInline(line)
        [code, _] = re.findall(r"<code>(.*?)</code>", html, re.S)
        assert unescape(code) == notes, html

    def test_a_notes_path_with_a_byte_no_encoding_knows_is_written_as_its_escape(self, tmp_path):
        """A state dir named with a byte that is not UTF-8 (`\\udcff` in Python's path) raised UnicodeEncodeError after the night."""
        target = tmp_path / "summary.md"
        assert append_step_summary(view("failed", "check_failed"), target, notes=Path("/srv/\udcff/notes.md"))
        assert "`/srv/\\udcff/notes.md`" in target.read_text(encoding="utf-8")

    def test_a_lone_surrogate_in_a_message_is_written_as_its_escape(self, tmp_path):
        """A model's broken output (a lone surrogate) in a signal message stays in its cell instead of failing the write."""
        target = tmp_path / "summary.md"
        assert append_step_summary(view("failed", "unknown_tool", signal_message="tool \ud83d?"), target)
        assert "tool \\ud83d?" in target.read_text(encoding="utf-8")

    def test_a_paused_tasks_reason_says_which_endpoint_refused_and_how(self, tmp_path):
        """A task paused by a 401 has, beside `model_unreachable`, the endpoint and its answer, as the text report says."""
        code, config, run = run_night(tmp_path, [Reply(status=401)], tasks=TASKS[:1])
        assert code == 3
        [row] = [line for line in step_summary(run).splitlines() if line.startswith("| fix-greet |")]
        api_base = load_config(config).model.api_base
        assert f"| `model_unreachable`: model endpoint {api_base} (openai/scripted) refused the request (401)" in row, row

    def test_a_paused_tasks_detail_stays_in_its_cell_and_is_cut_to_a_glance(self, tmp_path):
        """A recorded detail holding `|`, a line break, markdown and 1,000 characters stays in the reason cell, shown as
        typed and cut as the text report cuts it."""
        paused = view("paused", "model_unreachable")
        detail = "endpoint a | b\nsaid **no** " + "x" * 1000
        run = replace(paused, tasks=(replace(paused.tasks[0], detail=detail),))
        [row] = [line for line in step_summary(run).splitlines() if line.startswith("| t |")]
        assert "| `model_unreachable`: endpoint a \\| b said \\*\\*no\\*\\* xxx" in row and row.count(" | ") == 5, row
        assert len(row) < 400, row

    def test_pipes_in_messages_do_not_break_the_table(self, tmp_path):
        """A signal message containing | and newlines stays inside its cell."""
        target = tmp_path / "summary.md"
        append_step_summary(view("failed", "loop", signal_message="a | b\nc"), target)
        [row] = [line for line in target.read_text().splitlines() if line.startswith("| t |")]
        assert "a \\| b c" in row and row.count(" | ") == 5


    def test_a_summary_stays_within_githubs_mib_and_counts_the_rows_past_it(self, tmp_path):
        """500 paused tasks whose endpoint answered in bidi overrides (each escaped to 6 characters) made 1.3 MB: past
        GitHub's 1 MiB a step's whole summary is dropped. An earlier night's summary in the same step's file counts too."""
        one = view("paused", "model_unreachable", signal_message="\u202e" * 200).tasks[0]
        tasks = tuple(replace(one, id=n, name=f"task-{n:03d}", branch=f"overnight/task-{n:03d}", detail="\u202e" * 200) for n in range(500))
        target = tmp_path / "summary.md"
        target.write_text("earlier night\n" * 10_000)
        append_step_summary(replace(view("paused"), tasks=tasks), target)
        text = target.read_text()
        assert len(text.encode()) <= 1024 * 1024
        rows = [line for line in text.splitlines() if line.startswith("| task-")]
        assert 100 < len(rows) < 500 and text.endswith("(or `overnight notes`).\n\n")
        assert f"{rows[-1]}\n| … and {500 - len(rows)} more task(s), past GitHub's 1 MiB" in text

    def test_a_summary_that_fits_the_mib_exactly_keeps_every_row(self, tmp_path):
        """The room for the row that counts the rest was kept even when no row was left out: a night whose summary just
        fit lost its last task to "… and 1 more task(s), past GitHub's 1 MiB", which was not true."""
        one = view("paused", "model_unreachable").tasks[0]
        tasks = tuple(replace(one, id=n, name=f"task-{n:03d}", detail="é€😀" * 60) for n in range(20))
        run = replace(view("paused"), tasks=tasks)
        target = tmp_path / "summary.md"
        target.write_text("x" * (1024 * 1024 - len(step_summary(run).encode()) - 1) + "\n")  # the summary's exact room
        append_step_summary(run, target)
        text = target.read_text()
        assert len(text.encode()) == 1024 * 1024 and text.count("| task-") == 20 and "more task(s)" not in text

    @pytest.mark.parametrize("held", [1024 * 1024 - 200, 1024 * 1024, 2 * 1024 * 1024])
    def test_a_file_with_no_room_left_for_a_summary_gets_nothing(self, tmp_path, held):
        """Past 1 MiB GitHub drops the step's whole summary: a heading and a row counting every task, appended to a file
        (nearly) at it, only lost what earlier steps and nights had written there."""
        target = tmp_path / "summary.md"
        target.write_text("x" * (held - 1) + "\n")
        with pytest.raises(StepSummarySkipped, match="past GitHub's 1 MiB"):
            append_step_summary(view("failed", "check_failed"), target)
        assert target.stat().st_size == held

    def test_a_stream_sent_into_a_full_file_gets_the_whole_summary(self, tmp_path):
        """`GITHUB_STEP_SUMMARY=/dev/stdout overnight run >> night.log`: the log is no step summary GitHub uploads, so its
        size is no reason to skip the summary or cut its rows (it was skipped once the log held 1 MiB)."""
        log = tmp_path / "night.log"
        log.write_text("x" * (2 * 1024 * 1024 - 1) + "\n")
        descriptor = os.open(log, os.O_RDONLY)
        try:
            assert append_step_summary(view("failed", "check_failed"), Path(f"/dev/fd/{descriptor}"))
        finally:
            os.close(descriptor)
        added = log.read_text()[2 * 1024 * 1024:]
        assert added.startswith("## overnight run #7") and "| t | ❌ failed |" in added and "more task(s)" not in added

    def test_a_separator_control_character_in_a_message_is_shown_as_its_escape(self, tmp_path):
        """\\x1c to \\x1f and \\x85 are whitespace to `str.split()`: they became spaces in the cell, unseen."""
        target = tmp_path / "summary.md"
        assert append_step_summary(view("failed", "unknown_tool", signal_message="a\x1fb\x85c \t\r\n d"), target)
        assert "a\\x1fb\\x85c d |" in target.read_text(encoding="utf-8")

    def test_an_entity_in_a_model_chosen_name_stays_text(self, tmp_path):
        """`&#x202E;` would render as a right-to-left override on the job page: `&` is an entity too."""
        target = tmp_path / "summary.md"
        append_step_summary(view("failed", "unknown_tool", signal_message="unknown tool: &#x202E;exe.txt"), target)
        [row] = [line for line in target.read_text().splitlines() if line.startswith("| t |")]
        assert "&amp;#x202E;exe.txt" in row

    def test_a_summary_left_mid_line_by_an_earlier_step_still_starts_on_a_line_of_its_own(self, tmp_path):
        target = tmp_path / "summary.md"
        target.write_text("keep me")  # `echo -n`
        append_step_summary(view("failed", "check_failed"), target)
        assert target.read_text().startswith("keep me\n## overnight run #7")

    def test_a_model_chosen_name_shows_as_typed_not_as_an_image_or_a_link(self, tmp_path):
        """An unknown tool named like markdown stays text on the job page: no image loaded, no link to click."""
        target = tmp_path / "summary.md"
        message = "unknown tool: ![](https://e.vil/pixel.png) [approve the PR](https://e.vil) **now**"
        append_step_summary(view("failed", "unknown_tool", signal_message=message), target)
        [row] = [line for line in target.read_text().splitlines() if line.startswith("| t |")]
        assert "\\!\\[\\](https://e.vil/pixel.png) \\[approve the PR\\](https://e.vil) \\*\\*now\\*\\*" in row
        assert "![" not in row.replace("\\!\\[", "")

    @pytest.mark.parametrize(("message", "written"), [
        ("ping @team", "ping \\@<!-- -->team"),
        ("party :tada:", "party \\:<!-- -->tada\\:"),
        ("costs $x$ now", "costs \\$x\\$ now"),
        ("see #123", "see \\#<!-- -->123"),
        ("fix @org/team :+1: $$a$$ #1", "fix \\@<!-- -->org/team \\:<!-- -->+1\\: \\$\\$a\\$\\$ \\#<!-- -->1"),
        ("at 06:30 see http://x and &#x202E; or me @ home", "at 06:30 see http://x and &amp;#x202E; or me \\@ home"),
    ])
    def test_githubs_own_markdown_in_a_cell_is_written_escaped(self, tmp_path, message, written):
        """GitHub renders `$x$` as math, `:tada:` as 🎉, links `#123` to an issue and pings `@team`: a model-chosen
        name in a signal's message did all four on the job page. Each is backslash-escaped for markdown, and split from
        its word by an empty HTML comment GitHub drops: GitHub finds mentions, issue links and emoji after markdown took
        the backslashes away (github/markup#1168)."""
        target = tmp_path / "summary.md"
        append_step_summary(view("failed", "unknown_tool", signal_message=message), target)
        [row] = [line for line in target.read_text().splitlines() if line.startswith("| t |")]
        assert f"| severe `unknown_tool`: {written} |" in row, row
        markdown_it = pytest.importorskip("markdown_it")
        rendered = markdown_it.MarkdownIt("commonmark").renderInline(written)
        assert unescape(rendered.replace("<!-- -->", "")) == message

    def test_a_reason_detail_is_escaped_as_the_message_is(self):
        """A paused task's detail (the endpoint's words) is shown as typed; the name cell stays bare: a task's name holds
        only letters, digits, `.`, `_` and `-` (it names a branch), and readers find it as written."""
        paused = view("paused", "model_unreachable")
        run = replace(paused, tasks=(replace(paused.tasks[0], name="fix_greet", detail="endpoint said @team #9"),))
        [row] = [line for line in step_summary(run).splitlines() if line.startswith("| fix")]
        assert row.startswith("| fix_greet | ") and "`model_unreachable`: endpoint said \\@<!-- -->team \\#<!-- -->9 |" in row, row

    def test_a_notes_path_with_a_backslash_and_an_n_does_not_read_as_a_line_break(self):
        """`a\\nb` (a backslash and an `n`) and `a` + line break + `b` were both written `a\\nb`: the backslash is
        doubled, as Python's repr writes it, so only the line break reads `\\n`."""
        lines = {}
        for name in ("/srv/a\\nb/notes.md", "/srv/a\nb/notes.md"):
            text = step_summary(view("failed", "check_failed"), notes=Path(name))
            [lines[name]] = [line for line in text.splitlines() if line.startswith("notes.md:")]
        assert "`/srv/a\\\\nb/notes.md`" in lines["/srv/a\\nb/notes.md"]
        assert "`/srv/a\\nb/notes.md`" in lines["/srv/a\nb/notes.md"]

    def test_githubs_own_markdown_from_the_model_is_escaped_through_a_real_run(self, tmp_path):
        """`overnight run` with $GITHUB_STEP_SUMMARY set, a model calling a tool named `fix @team :tada: $x$ #1`: the
        summary's row shows the name as typed. (A task's name cannot hold these: it names a branch.)"""
        summary, name = tmp_path / "summary.md", "fix @team :tada: $x$ #1"
        done = json_night(tmp_path, env={"GITHUB_STEP_SUMMARY": str(summary)}, script=[call(name, {})] * 6)
        assert done.returncode == 1, done.stderr
        text = summary.read_text(encoding="utf-8")
        assert "fix \\@<!-- -->team \\:<!-- -->tada\\: \\$x\\$ \\#<!-- -->1" in text, text
        assert "@team" not in text and ":tada:" not in text and "$x$" not in text and "#1" not in text.replace("run #", ""), text


# Two tasks a deadline can end: names with `_`, which markdown would read as emphasis.
DEADLINE_TASKS = [
    {"name": "first_one", "prompt": "p", "check": "python check_greet.py"},
    {"name": "second_one", "prompt": "p", "check": "python check_greet.py"},
]
IN_UTC = '\n[schedule]\ntimezone = "UTC"\n'


def suite_properties(root: ET.Element) -> dict[str | None, str | None]:
    return {p.get("name"): p.get("value") for p in root.find("testsuite").find("properties").findall("property")}


def skipped_message(root: ET.Element, name: str) -> str | None:
    skipped = case_named(root, name).find("skipped")
    assert skipped is not None
    return skipped.get("message")


def skipped_text(root: ET.Element, name: str) -> str | None:
    skipped = case_named(root, name).find("skipped")
    assert skipped is not None
    return skipped.text


class TestDeadlineInCiReports:
    def test_a_night_cut_at_its_deadline_says_so_in_the_junit_file_and_the_step_summary(self, config_file, server, tmp_path):
        """A night cut at its 06:30 deadline: each ended task's <skipped> says the deadline cut it short or came before it
        started, the suite's properties name the deadline in UTC, and the step summary has the report's deadline line under
        its heading, markdown-escaped. A CI page showed two bare `cancelled` tasks, no hint the night ran out of time."""
        from tests.test_unattended import EDIT_THEN_WAIT, clock_from, run_in_process

        config = config_file(tasks=DEADLINE_TASKS, model={"request_timeout_s": 60}, night={"deadline": "06:30"}, extra=IN_UTC)
        server.enqueue(*EDIT_THEN_WAIT)
        assert run_in_process(config, now=clock_from(datetime(2026, 11, 30, 6, 29, 58, tzinfo=timezone.utc))).exit_code == 1
        run = stored_run(config)
        root = junit_of(run, tmp_path / "junit.xml")
        assert skipped_message(root, "first_one") == "cancelled" and skipped_text(root, "first_one") == "the night's deadline 2026-11-30T06:30:00+00:00 cut it short"
        assert skipped_message(root, "second_one") == "cancelled" and skipped_text(root, "second_one") == "the night's deadline 2026-11-30T06:30:00+00:00 came before it started"
        assert suite_properties(root)["deadline"] == "2026-11-30T06:30:00+00:00"
        assert root.find("testsuite").get("skipped") == "2"  # still <skipped>, as any cancelled task
        lines = step_summary(run, zone=timezone.utc).splitlines()
        assert lines[1:4] == ["", r"deadline 2026-11-30 06:30 UTC · cut short: first\_one · not started: second\_one", ""]
        assert lines[4].startswith("| task | outcome |")

    def test_overnight_run_begun_after_its_deadline_names_it_in_both_ci_reports(self, config_file, server, tmp_path, monkeypatch):
        """`overnight run --scheduled-for` an hour after its fire's deadline starts nothing: its --junit file (in UTC) and
        its step summary (on the `[schedule] timezone`'s clock, as `overnight report`) say the deadline left every task
        unstarted."""
        from zoneinfo import ZoneInfo

        fired = (datetime.now(timezone.utc) - timedelta(hours=2)).replace(second=0, microsecond=0)
        deadline = fired + timedelta(hours=1)
        local = deadline.astimezone(ZoneInfo("Asia/Kolkata"))
        config = config_file(tasks=DEADLINE_TASKS, night={"deadline": f"{local:%H:%M}"}, extra='\n[schedule]\ntimezone = "Asia/Kolkata"\n')
        summary, junit = tmp_path / "summary.md", tmp_path / "junit.xml"
        monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
        assert overnight("run", "--config", str(config), "--scheduled-for", fired.isoformat(), "--junit", str(junit)) == 1
        assert server.requests == []
        root = ET.parse(junit).getroot()
        for name in ("first_one", "second_one"):
            assert skipped_message(root, name) == "cancelled" and skipped_text(root, name) == f"the night's deadline {deadline.isoformat()} came before it started"
        assert suite_properties(root)["deadline"] == deadline.isoformat()
        line = summary.read_text(encoding="utf-8").splitlines()[2]
        assert line == rf"deadline {local:%Y-%m-%d %H:%M} IST · not started: first\_one, second\_one"

    def test_a_night_done_before_its_deadline_or_without_one_adds_nothing_to_the_ci_reports(
        self, config_file, server, tmp_path, monkeypatch, capsys,
    ):
        """A deadline that ended no task (the report names it, with nothing cut) and no deadline at all: the JUnit file has
        no `deadline` property and the step summary no deadline line; CI has nothing to explain."""
        from tests.test_night import FIX

        clock = f"{datetime.now(timezone.utc) + timedelta(hours=12):%H:%M}"  # no night of this test's comes near it
        recorded = []
        for night in ({"deadline": clock}, {}):
            config = config_file(night=night, extra=IN_UTC)
            summary, junit = tmp_path / "summary.md", tmp_path / "junit.xml"
            summary.unlink(missing_ok=True)
            monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
            server.enqueue(*FIX)
            assert overnight("run", "--config", str(config), "--junit", str(junit)) == 0
            assert "deadline" not in suite_properties(ET.parse(junit).getroot())
            text = summary.read_text(encoding="utf-8")
            assert "deadline" not in text and text.splitlines()[2].startswith("| task | outcome |")
            recorded.append(report_json(config, capsys)["run"]["deadline"])
        # The first night had a deadline, recorded (the morning report names it); the second none.
        assert [bool(deadline and deadline["at"]) for deadline in recorded] == [True, False]

    def test_a_run_that_kept_no_deadline_instant_says_so_and_has_no_deadline_property(self, tmp_path):
        """A run an older version recorded (no deadline instant) whose task the deadline ended: the message says the
        deadline did it, its time not recorded, and the suite has no `deadline` property to give an empty value."""
        root = junit_of(view("cancelled", "deadline"), tmp_path / "junit.xml")
        assert skipped_message(root, "t") == "cancelled" and skipped_text(root, "t") == "the night's deadline (its time not recorded) cut it short"
        assert "deadline" not in suite_properties(root)
        assert step_summary(view("cancelled", "deadline")).splitlines()[2] == "deadline (its time not recorded) · cut short: t"

    def test_a_task_cancelled_otherwise_keeps_its_bare_message(self, tmp_path):
        """A signal's cancel beside a deadline's: only the deadline's task names it; the other stays `cancelled`."""
        run = view("cancelled", "deadline")
        other = replace(run.tasks[0], id=2, name="u", reason="SIGTERM")
        run = replace(run, tasks=(run.tasks[0], other), deadline=datetime(2024, 5, 1, 6, 30, tzinfo=timezone.utc))
        root = junit_of(run, tmp_path / "junit.xml")
        assert (skipped_message(root, "u"), skipped_text(root, "u")) == ("cancelled", None)
        assert skipped_message(root, "t") == "cancelled" and skipped_text(root, "t") == "the night's deadline 2024-05-01T06:30:00+00:00 cut it short"

    def test_a_file_with_room_for_the_heading_and_the_counting_row_still_gets_them_without_the_deadline_line(self, tmp_path):
        """reference.md: only a file with no room even for the heading and the row that counts the tasks gets nothing. A
        file with just that room, whose night the deadline cut, got nothing: the deadline's line took the room."""
        one = view("cancelled", "deadline").tasks[0]
        # Long names: the deadline's line (five of them) takes more than a row, and no row fits beside the counting one.
        tasks = tuple(replace(one, id=n, name=f"{n}{'t' * 63}", branch=f"overnight/{n}{'t' * 63}") for n in range(5))
        cut = replace(view("cancelled"), tasks=tasks, deadline=datetime(2024, 5, 1, 6, 30, tzinfo=timezone.utc))
        least = step_summary(replace(cut, tasks=tuple(replace(task, reason="SIGTERM") for task in tasks)), room=0)  # no deadline
        assert "deadline" in step_summary(cut) and "more task(s)" in least
        target = tmp_path / "summary.md"
        target.write_text("x" * (1024 * 1024 - len(least.encode()) - 1) + "\n")
        append_step_summary(cut, target)
        added = target.read_text(encoding="utf-8").split("\n", 1)[1]
        assert target.stat().st_size == 1024 * 1024 and "deadline" not in added and "… and 5 more task(s)" in added


class TestStateDirFiles:
    def test_each_file_a_night_leaves_in_the_state_dir_is_a_row_of_the_references_files_table(self, night):
        """What a night leaves in `[state] dir` is each named in reference.md's "Files" table (SQLite's own -wal and -shm aside)."""
        import re

        _, config, _ = night
        reference = (Path(__file__).parent.parent / "docs" / "reference.md").read_text(encoding="utf-8")
        table = reference.split("## Files (under `[state] dir`)", 1)[1].split("\n## ", 1)[0]
        rows = {re.split(r"[/ ]", first)[0] for first in re.findall(r"^\| `([^`]+)`", table, re.MULTILINE)}
        left = {path.name for path in load_config(config).state_dir.iterdir() if not path.name.endswith(("-wal", "-shm"))}
        assert {"notes.md", "runs.db", "transcripts", "worktrees", "overnight.lock", "state-id"} <= left  # the night ran
        assert sorted(left - rows) == []


class TestReportJson:
    """`overnight report --json` is a public contract (docs/reference.md): values as documented, not only keys."""

    def test_the_nights_json_report_holds_what_the_reference_says(self, night, capsys):
        _, config, run = night
        report = report_json(config, capsys)
        assert (report["run"]["id"], report["run"]["status"], report["run"]["exit_code"]) == (run.id, "finished", 1)
        for moment in (report["run"]["started_at"], report["run"]["finished_at"]):
            assert moment[10] == "T" and datetime.fromisoformat(moment).utcoffset() == timedelta(0), moment
        tasks = {task["name"]: task for task in report["tasks"]}
        done, never = tasks["fix-greet"], tasks["never"]
        tip = git(config.parent / "repo", "rev-parse", "overnight/fix-greet")
        # A task's reason is "" when there is none, an iteration's null; no signals: worst null, counts {}.
        assert (done["outcome"], done["reason"], done["commit"], done["worst_signal"], done["signal_counts"]) == ("succeeded", "", tip, None, {})
        assert [(it["outcome"], it["reason"], it["commit"]) for it in done["iterations"]] == [("committed", None, tip)]
        assert (never["outcome"], never["reason"], never["commit"]) == ("failed", "check_failed", None)
        assert [(it["number"], it["outcome"], it["reason"], it["commit"]) for it in never["iterations"]] == [
            (1, "rolled_back", "repeated_tool_call", None), (2, "rolled_back", "check_failed", None)]
        # The worst signal is a severe one, though the loop's warnings came first; the counts name the levels that occurred.
        assert never["worst_signal"]["level"] == "severe" and never["iterations"][0]["worst_signal"]["kind"] == "repeated_tool_call"
        levels = [signal["level"] for it in never["iterations"] for signal in it["signals"]]
        assert "warning" in levels and never["signal_counts"] == {"warning": levels.count("warning"), "severe": levels.count("severe")}
        assert all(Path(it["transcript"]).is_absolute() and Path(it["transcript"]).is_file() for it in never["iterations"])
        # The fields issue 2 fixed for tests outside the repository: branch, and per iteration tokens and turns.
        assert [task["branch"] for task in report["tasks"]] == ["overnight/fix-greet", "overnight/never"]
        for it in done["iterations"] + never["iterations"]:
            assert type(it["tokens"]) is int and it["tokens"] > 0 and type(it["turns"]) is int and it["turns"] > 0, it
            assert all(set(signal) == {"level", "kind", "message"} and signal["level"] in ("warning", "severe") for signal in it["signals"])
        assert [it["turns"] for it in never["iterations"]] == [4, 1]  # four reads (the 4th stopped), then the submit

    def test_the_json_report_names_every_kept_branch_of_the_runs_tasks(self, config_file, server, repo, capsys):
        """A person's edit the next night kept off the task's worktree, beside a year of older kept branches: `report
        --json` names every one of the run's tasks' in `kept_branches`, not another task's (only the text report named
        them, the newest twenty)."""
        config = a_persons_edit_kept_by_the_next_night(config_file, server)
        [tonight] = git(repo, "branch", "--list", "--format=%(refname:short)", "overnight-kept/fix-greet/*").splitlines()
        older = [f"overnight-kept/fix-greet/2025{month:02d}{day:02d}T000000.000000Z" for month in range(1, 13) for day in (1, 15)]
        for name in [*older, "overnight-kept/another-task/20251201T000000.000000Z"]:
            git(repo, "branch", name)
        kept = report_json(config, capsys)["kept_branches"]
        assert kept == sorted([*older, tonight]), kept
        assert "+# reviewed: keep the spelling test" in git(repo, "show", kept[-1])

    def test_the_fields_of_the_json_report_are_exactly_the_references_example(self, night, capsys):
        """Each object of `report --json` (run, task, iteration, signal) has the keys reference.md's example shows, no more, no fewer."""
        import re

        _, config, _ = night
        report = report_json(config, capsys)
        reference = (Path(__file__).parent.parent / "docs" / "reference.md").read_text(encoding="utf-8")
        [example] = re.findall(r"## `overnight report --json`\s+```json\n(.*?)```", reference, re.DOTALL)
        # The example elides a repeated object as {…}; read as JSON once that is null.
        documented = json.loads(example.replace("{…}", "null"))
        never = next(task for task in report["tasks"] if task["iterations"] and task["iterations"][0]["signals"])
        shown_task, shown_iteration = documented["tasks"][0], documented["tasks"][0]["iterations"][0]
        assert set(report) == set(documented)
        assert set(report["run"]) == set(documented["run"])
        assert all(set(task) == set(shown_task) for task in report["tasks"])
        assert all(set(it) == set(shown_iteration) for task in report["tasks"] for it in task["iterations"])
        assert set(never["worst_signal"]) == set(shown_task["worst_signal"]) == set(shown_iteration["signals"][0])

    def test_the_json_reports_keys_come_in_the_documented_order_with_these_values(self):
        """A run's and a task's and an iteration's keys, their order and their values are those of docs/reference.md, to the byte."""
        from orchestrator.report import as_json

        run = view("failed", "check_failed", signal_message="check failed: exit 1")
        task = run.tasks[0]
        iteration = replace(task.iterations[0], transcript="/state/transcripts/task-run-1-t-1.jsonl")
        run = replace(run, tasks=(replace(task, iterations=(iteration,), unused_tokens=5),))
        signal = '{"level": "severe", "kind": "check_failed", "message": "check failed: exit 1"}'
        assert json.dumps(as_json(run)) == (
            '{"run": {"id": 7, "status": "finished", "exit_code": 1, "started_at": "2024-05-01T01:30:00+00:00", '
            '"finished_at": "2024-05-01T01:30:05+00:00", "tokens": 15, "deadline": null}, '
            '"tasks": [{"name": "t", "outcome": "failed", "reason": "check_failed", "branch": "overnight/t", "commit": null, '
            f'"worst_signal": {signal}, "signal_counts": {{"severe": 1}}, "tokens": 15, "unused_tokens": 5, '
            f'"iterations": [{{"number": 1, "outcome": "rolled_back", "reason": "check_failed", "signals": [{signal}], '
            f'"worst_signal": {signal}, "tokens": 10, "turns": 2, "commit": null, '
            '"transcript": "/state/transcripts/task-run-1-t-1.jsonl"}]}], "kept_branches": []}'
        )

    def test_a_night_that_exited_0_says_exit_0_everywhere(self, tmp_path):
        """Exit 0 is an exit code, not "none yet": JSON 0 (not null), and the text report and step summary say it."""
        from orchestrator.report import as_json, as_text

        one = view("succeeded")
        run = replace(one, exit_code=0, tasks=(replace(one.tasks[0], reason="", commit="abc1234567890"),))
        assert as_json(run)["run"]["exit_code"] == 0
        assert " · exit 0 · " in as_text(run).splitlines()[0]
        assert step_summary(run).startswith("## overnight run #7: 1/1 task(s) succeeded (finished, exit 0)")

    def test_only_succeeded_tasks_are_offered_for_merge(self):
        """"To review and merge" lists the succeeded task's diff, not the failed, cancelled or skipped ones' branches."""
        from orchestrator.report import as_text

        one = view("failed", "check_failed").tasks[0]
        tasks = tuple(replace(one, id=n, name=name, branch=f"overnight/{name}", outcome=outcome, reason=reason) for n, (name, outcome, reason) in
                      enumerate([("ok", "succeeded", ""), ("no", "failed", "check_failed"), ("stop", "cancelled", "cancelled"),
                                 ("away", "skipped", "leased")], start=1))
        text = as_text(replace(view("failed"), tasks=tasks), base="main")
        assert [line for line in text.splitlines() if "git diff" in line] == ["  git diff main...overnight/ok"]

    def test_work_an_earlier_run_of_the_scheduled_night_committed_is_offered_for_merge(self):
        """A night `serve` began again skips a task its fire's earlier run committed (`done_earlier_tonight`):
        this run's report is the one the morning reads, so the commit it names is still there to review."""
        from orchestrator.report import as_text

        one = view("failed", "check_failed").tasks[0]
        tasks = tuple(replace(one, id=n, name=name, branch=f"overnight/{name}", outcome="skipped", reason="done_earlier_tonight", commit=commit, iterations=())
                      for n, (name, commit) in enumerate([("done", "abc1234567890"), ("as-it-was", "")], start=1))
        text = as_text(replace(view("failed"), tasks=tasks), base="main")
        assert [line for line in text.splitlines() if "git diff" in line] == ["  git diff main...overnight/done"]


def json_night(folder: Path, *args: str, env: dict[str, str] | None = None, script: list[Any] | None = None,
               model: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    """`overnight run --log-format json` as CI runs it: a subprocess, stdin closed."""
    repo = make_repo(folder / "repo", SAMPLE_FILES)
    with ScriptedServer(SCRIPT if script is None else script) as server:
        more = {"model": model} if model else {}
        config = write_config(folder / "overnight.toml", api_base=server.url, repo=repo, tasks=TASKS, **more)
        return subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--log-format", "json", *args],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120,
            env={**os.environ, "NO_COLOR": "1", **(env or {})},
        )


@pytest.fixture(scope="module")
def json_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    return json_night(tmp_path_factory.mktemp("json"))


def log_events(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


class TestReportsThatCannotBeWritten:
    def test_a_junit_path_that_cannot_be_written_stops_before_the_night(self, tmp_path):
        """Found out at once, in one line (exit 2), not after a night whose report then goes nowhere."""
        done = json_night(tmp_path, "--junit", str(tmp_path / "missing" / "junit.xml"))
        assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "--junit" in done.stderr, done.stderr
        assert not (tmp_path / "state" / "runs.db").exists()

    @pytest.mark.parametrize("target", ["overnight.toml", "state/runs.db", "state/notes.md"])
    def test_a_junit_path_that_names_the_config_or_the_state_dir_is_refused(self, tmp_path, target):
        """`--junit overnight.toml` would have replaced the config; `--junit .overnight/runs.db` every night's record."""
        (tmp_path / "state").mkdir()
        done = json_night(tmp_path, "--junit", str(tmp_path / target))
        assert done.returncode == 2, done.stderr
        assert ("config file" if target.endswith(".toml") else "state dir") in json.loads(done.stderr.strip())["error"]
        assert not (tmp_path / "state" / "runs.db").exists()

    @pytest.mark.parametrize("url", ["sqlite:///runs.db", "sqlite:///file:runs.db?mode=rwc&uri=true"])
    @pytest.mark.parametrize("target", ["runs.db", "runs.db-wal"])
    def test_a_junit_path_that_names_a_run_store_outside_the_state_dir_is_refused(self, tmp_path, target, url):
        """`[store] url = "sqlite:///runs.db"` keeps the store beside the config: `--junit runs.db` would replace it.
        In SQLite's URI form (the form reference.md gives for `mode=`), it was not seen as the store: replaced."""
        repo = make_repo(tmp_path / "repo", SAMPLE_FILES)
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, extra=f"\n[store]\nurl = \"{url}\"\n")
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--junit", str(tmp_path / target)],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60,
        )
        assert done.returncode == 2 and "is the run store" in done.stderr, done.stderr
        assert not (tmp_path / target).exists()

    def test_what_is_not_a_file_is_written_into_and_a_file_keeps_its_permissions(self, tmp_path):
        """`--junit /dev/stdout` or `/dev/null` (here through a link) is written into, not replaced by a file."""
        (tmp_path / "null.xml").symlink_to(os.devnull)
        assert json_night(tmp_path / "a", "--junit", str(tmp_path / "null.xml")).returncode == 1
        assert (tmp_path / "null.xml").is_symlink() and Path(os.devnull).is_char_device()
        report = tmp_path / "junit.xml"
        report.write_text("old")
        report.chmod(0o644)
        assert json_night(tmp_path / "b", "--junit", str(report)).returncode == 1
        assert report.stat().st_mode & 0o777 == 0o644 and ET.parse(report).getroot().get("tests") == "2"

    @pytest.mark.parametrize("target", ["junit.xml", "nowhere/junit.xml"])
    def test_a_link_that_leads_nowhere_is_replaced_by_the_report(self, tmp_path, target):
        """A link at --junit is replaced by the file (reference.md), a dangling one too; one that leads to itself passed
        the check before the night (nothing there, as for a dangling one) and then the write failed: no report,
        `ci_report_failed`, after the whole night."""
        link = tmp_path / "junit.xml"
        link.symlink_to(target)  # "junit.xml": a loop
        done = json_night(tmp_path, "--junit", str(link))
        assert done.returncode == 1, done.stderr
        assert "ci_report_failed" not in [e["event"] for e in log_events(done.stderr)]
        assert not link.is_symlink() and ET.parse(link).getroot().get("tests") == "2"

    def test_an_unwritable_step_summary_is_logged_and_the_exit_code_stays_the_nights(self, tmp_path):
        """$GITHUB_STEP_SUMMARY is GitHub's to get right: exit 1 still says a task failed, the log says what was not written."""
        done = json_night(tmp_path, "--junit", str(tmp_path / "junit.xml"), env={"GITHUB_STEP_SUMMARY": str(tmp_path / "no" / "summary.md")})
        assert done.returncode == 1, done.stderr
        failed = [e for e in log_events(done.stderr) if e["event"] == "ci_report_failed"]
        assert len(failed) == 1 and "step summary" in failed[0]["error"]
        assert ET.parse(tmp_path / "junit.xml").getroot().get("tests") == "2"
        assert all(line.startswith("{") for line in done.stderr.splitlines() if line.strip())


    @pytest.mark.parametrize("summary", ["junit.xml", "link-to-junit.xml"])
    def test_a_step_summary_that_is_the_junit_file_is_skipped_and_the_junit_xml_stays_whole(self, tmp_path, summary):
        """The same file by its name or through a link: the markdown was appended to the XML, which no longer parsed."""
        (tmp_path / "link-to-junit.xml").symlink_to("junit.xml")
        done = json_night(tmp_path, "--junit", str(tmp_path / "junit.xml"), env={"GITHUB_STEP_SUMMARY": str(tmp_path / summary)})
        assert done.returncode == 1, done.stderr
        assert ET.parse(tmp_path / "junit.xml").getroot().get("tests") == "2"
        [skipped] = [e for e in log_events(done.stderr) if e["event"] == "step_summary_skipped"]
        assert skipped["level"] == "warning" and skipped["path"] == str(tmp_path / summary) and "--junit" in skipped["reason"]
        assert "ci_report_failed" not in [e["event"] for e in log_events(done.stderr)]

    def test_a_step_summary_file_already_at_githubs_limit_is_skipped_and_said_why(self, tmp_path):
        """Nothing is appended to a step's summary file that holds 1 MiB already; `step_summary_skipped` says why."""
        summary = tmp_path / "summary.md"
        summary.write_text("x" * (1024 * 1024 - 1) + "\n")
        done = json_night(tmp_path, "--junit", str(tmp_path / "junit.xml"), env={"GITHUB_STEP_SUMMARY": str(summary)})
        assert done.returncode == 1, done.stderr
        [skipped] = [e for e in log_events(done.stderr) if e["event"] == "step_summary_skipped"]
        assert skipped["level"] == "warning" and skipped["path"] == str(summary) and "1 MiB" in skipped["reason"], skipped
        assert summary.stat().st_size == 1024 * 1024 and "ci_report_failed" not in [e["event"] for e in log_events(done.stderr)]
        assert ET.parse(tmp_path / "junit.xml").getroot().get("tests") == "2"

    @pytest.mark.parametrize("target", ["overnight.toml", "state/notes.md"])
    def test_a_step_summary_that_names_the_config_or_notes_is_not_appended_to(self, tmp_path, target):
        """Appended to the config, the next night's was not TOML (exit 2); to notes.md, a table among the notes."""
        (tmp_path / "state").mkdir()
        done = json_night(tmp_path, env={"GITHUB_STEP_SUMMARY": str(tmp_path / target)})
        assert done.returncode == 1, done.stderr
        [failed] = [e for e in log_events(done.stderr) if e["event"] == "ci_report_failed"]
        assert "$GITHUB_STEP_SUMMARY" in failed["error"]
        assert "## overnight run" not in (tmp_path / target).read_text()
        assert load_config(tmp_path / "overnight.toml").task


def night_on_a_terminal(folder: Path, *, no_color: bool) -> tuple[int, str]:
    """`overnight run` with no --log-format, its stderr a terminal (a pty) as when a person runs it: exit code, what it showed."""
    repo = make_repo(folder / "repo", SAMPLE_FILES)
    env = {key: value for key, value in os.environ.items() if key != "NO_COLOR"} | ({"NO_COLOR": "1"} if no_color else {})
    with ScriptedServer(SCRIPT) as server:
        config = write_config(folder / "overnight.toml", api_base=server.url, repo=repo, tasks=TASKS)
        terminal, stderr = os.openpty()
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, env=env,
        )
        os.close(stderr)
        shown = b""
        try:
            while chunk := os.read(terminal, 65536):  # read as it comes: a full pty would hold the night up
                shown += chunk
        except OSError:  # EIO: the night closed its end
            pass
        finally:
            os.close(terminal)
        return process.wait(timeout=120), shown.decode("utf-8", "replace")


class TestTerminalLogs:
    """Issues 4 and 5: human lines on a terminal (JSON lines otherwise), and a line per signal, yellow ⚠ or red ✖, plain with NO_COLOR."""

    def test_a_terminal_gets_human_lines_and_coloured_signal_lines(self, tmp_path):
        code, shown = night_on_a_terminal(tmp_path, no_color=False)
        assert code == 1, shown
        assert "night_started" in shown and "task_finished" in shown
        assert not [line for line in shown.splitlines() if line.startswith("{")], "JSON lines on a terminal"
        assert "\x1b[33m⚠ [never] repeated_tool_call:" in shown and "\x1b[31m✖ [never] check_failed:" in shown

    def test_no_color_keeps_the_signal_lines_plain(self, tmp_path):
        code, shown = night_on_a_terminal(tmp_path, no_color=True)
        assert code == 1, shown
        assert "⚠ [never] repeated_tool_call:" in shown and "✖ [never] check_failed:" in shown
        assert "\x1b[3" not in shown


class TestJsonLogs:
    def test_every_log_line_is_json_with_event_and_run_id(self, json_run):
        """Each JSON log line names a stable event and the run it belongs to."""
        assert json_run.returncode == 1, json_run.stderr
        events = log_events(json_run.stderr)
        names = [e["event"] for e in events]
        assert names[0] == "night_started" and names[-1] == "night_finished"
        assert all(isinstance(e.get("run_id"), int) for e in events)
        assert {e["run_id"] for e in events} == {events[0]["run_id"]}

    def test_task_and_iteration_events_carry_their_ids(self, json_run):
        """Task events carry the task and its id; iteration events add the iteration number and id."""
        events = log_events(json_run.stderr)
        for event in events:
            if event["event"].startswith(("task_", "iteration_", "signal")):
                assert event.get("task") in {"fix-greet", "never"} and isinstance(event.get("task_run_id"), int), event
            if event["event"].startswith("iteration_") or event["event"] == "signal":
                assert isinstance(event.get("iteration"), int) and isinstance(event.get("iteration_id"), int), event
        rolled = [e for e in events if e["event"] == "iteration_rolled_back"]
        assert [(e["task"], e["iteration"], e["reason"]) for e in rolled] == [("never", 1, "repeated_tool_call"), ("never", 2, "check_failed")]

    def test_each_task_and_iteration_is_logged_under_its_stable_names(self, json_run):
        """The landmarks docs/ci.md names for a log pipeline, in order per task, with the fields reference.md
        gives them: a renamed or dropped event passes the id checks above, as they only look at what is there."""
        events = log_events(json_run.stderr)
        course = {
            task: [e["event"] for e in events if e.get("task") == task and e["event"].startswith(("task_", "iteration_"))]
            for task in ("fix-greet", "never")
        }
        assert course == {
            "fix-greet": ["task_started", "iteration_started", "iteration_committed", "task_finished"],
            "never": ["task_started", *["iteration_started", "iteration_rolled_back"] * 2, "task_finished"],
        }
        started = [e for e in events if e["event"] == "task_started"]
        assert [e["branch"] for e in started] == ["overnight/fix-greet", "overnight/never"]
        finished = {e["task"]: (e["outcome"], e["reason"], e["iterations"]) for e in events if e["event"] == "task_finished"}
        assert finished == {"fix-greet": ("succeeded", "", 1), "never": ("failed", "check_failed", 2)}
        [committed] = [e for e in events if e["event"] == "iteration_committed"]
        assert committed["commit"] and isinstance(committed["turns"], int) and isinstance(committed["tokens"], int)
        rolled = [(e["reason"], e["turns"]) for e in events if e["event"] == "iteration_rolled_back"]
        assert rolled == [("repeated_tool_call", 4), ("check_failed", 1)]
        assert all(isinstance(e["tokens"], int) for e in events if e["event"] == "iteration_rolled_back")
        assert all(e["level"] and e["timestamp"] for e in events)

    def test_model_and_tool_calls_are_logged_only_when_asked(self, json_run, tmp_path):
        """`-v` (`--verbose`) adds a `model_call` event per answer and a `tool_call` per call, with the iteration's ids."""
        assert not {"model_call", "tool_call"} & {e["event"] for e in log_events(json_run.stderr)}
        done = json_night(tmp_path, "-v")
        assert done.returncode == 1, done.stderr
        events = log_events(done.stderr)
        calls = [e for e in events if e["event"] in ("model_call", "tool_call")]
        tools = [e["tool"] for e in calls if e["event"] == "tool_call" and e["task"] == "fix-greet"]
        assert tools == ["list_dir", "read_file", "edit_file", "run_check", "submit"]
        assert sum(e["event"] == "model_call" and e["task"] == "fix-greet" for e in calls) == 5
        for event in calls:
            assert isinstance(event["run_id"], int) and isinstance(event["task_run_id"], int), event
            assert isinstance(event["iteration"], int) and isinstance(event["iteration_id"], int), event

    def test_signal_events_say_how_severe_the_signal_was(self, json_run):
        """A signal event's `level` is the signal's, as in the report: the log level would say `warning` for all."""
        signals = [(e["task"], e["iteration"], e["kind"], e["level"]) for e in log_events(json_run.stderr) if e["event"] == "signal"]
        assert ("never", 1, "repeated_tool_call", "severe") in signals
        assert ("never", 1, "repeated_tool_call", "warning") in signals
        assert ("never", 2, "check_failed", "severe") in signals
        assert all(e["message"] for e in log_events(json_run.stderr) if e["event"] == "signal")  # reference.md: `level`, `kind`, `message`

    def test_an_error_that_ends_the_night_is_a_json_line_too(self, tmp_path):
        """With --log-format json even the error that ends the command is an event a pipeline can parse."""
        (tmp_path / "state" / "worktrees").mkdir(parents=True)
        (tmp_path / "state" / "worktrees" / "never").write_text("a file where the worktree would go\n")
        done = json_night(tmp_path)
        assert done.returncode == 2, done.stderr
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert all(line.startswith("{") for line in lines), lines
        last = json.loads(lines[-1])
        assert last["event"] == "command_failed" and last["exit_code"] == 2 and "cannot create the worktree" in last["error"]

    def test_json_mode_writes_nothing_but_json_on_stderr(self, json_run):
        """With --log-format json every stderr line is a JSON object, so a log pipeline can parse the stream."""
        lines = [line for line in json_run.stderr.splitlines() if line.strip()]
        assert all(line.startswith("{") for line in lines), [line for line in lines if not line.startswith("{")]

    def test_json_mode_stays_json_when_python_shows_its_warnings(self, tmp_path):
        """PYTHONWARNINGS=default (a CI's, or -X dev) showed a ResourceWarning for each command's pipe, as plain lines."""
        done = json_night(tmp_path, env={"PYTHONWARNINGS": "default"})
        assert done.returncode == 1, done.stderr
        events = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
        assert all(isinstance(event, dict) for event in events) and "python_warning" not in [e["event"] for e in events]

    def test_json_mode_stays_json_to_the_end_on_litellm_after_an_error_answer(self, tmp_path):
        """Through litellm a 500 left its kept-alive connection in litellm's client cache, collected at exit, after the hook
        could act: `sys:1: ResourceWarning: unclosed <socket.socket ...>` was the plain last line."""
        done = json_night(tmp_path, env={"PYTHONWARNINGS": "default"}, script=[Reply(status=500, text="boom")] * 20,
                          model={"transport": "litellm", "request_timeout_s": 3})
        assert done.returncode == 3, done.stderr
        events = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
        assert all(isinstance(event, dict) for event in events) and "python_warning" not in [e["event"] for e in events]
