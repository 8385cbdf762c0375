"""A whole night through the CLI: real git, real litellm over HTTP to a scripted server, real SQLite."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.history import LEFT_OUT
from orchestrator.scripted import Reply, call, say
from tests.conftest import git, make_repo

FIX = [
    call("list_dir", {"path": "."}),
    call("read_file", {"path": "greet.py"}),
    call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}),
    call("run_check", {}),
    call("submit", {"summary": "fixed the typo"}),
]


def overnight(*args: str, capsys: Any = None) -> int:
    """Run the real CLI entry point in-process; return its exit code."""
    import sys

    argv = sys.argv
    sys.argv = ["overnight", *args]
    try:
        main()
    except SystemExit as done:
        return int(done.code or 0)
    finally:
        sys.argv = argv
    return 0


def report_json(config: Path, capsys: Any) -> dict[str, Any]:
    capsys.readouterr()
    assert overnight("report", "--config", str(config)) == 0
    capsys.readouterr()
    assert overnight("report", "--config", str(config), "--json") == 0
    return json.loads(capsys.readouterr().out)


def a_persons_edit_kept_by_the_next_night(config_file: Any, server: Any) -> Path:
    """The config of two nights: the first fixes fix-greet, a person then edits its worktree, and the second keeps that
    edit on an `overnight-kept/fix-greet/<time>` branch before it cleans the worktree."""
    config = config_file(night={"max_iterations": 1})
    server.enqueue(*FIX)
    assert overnight("run", "--config", str(config)) == 0
    with (config.parent / "state" / "worktrees" / "fix-greet" / "greet.py").open("a") as greet:
        greet.write("# reviewed: keep the spelling test\n")
    server.enqueue(call("submit", {"summary": "it passes already"}))
    assert overnight("run", "--config", str(config)) == 0
    return config


def notes_text(config: Path) -> str:
    path = config.parent / "state" / "notes.md"
    return path.read_text() if path.exists() else ""


def worktree(config: Path, task: str = "fix-greet") -> Path:
    return config.parent / "state" / "worktrees" / task


def user_messages(request: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content")) for m in request["messages"] if m["role"] == "user")


class TestSuccess:
    def test_passing_check_commits_on_the_task_branch(self, config_file, server, repo, capsys):
        """A model that fixes the bug and submits gets its work committed on overnight/<task>; exit 0."""
        config = config_file()
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        assert "return 'hello'" in git(repo, "show", "overnight/fix-greet:greet.py")
        assert "fix-greet iteration 1" in git(repo, "log", "-1", "--format=%B", "overnight/fix-greet")
        report = report_json(config, capsys)
        task = report["tasks"][0]
        assert task["name"] == "fix-greet" and task["outcome"] == "succeeded"
        assert task["branch"] == "overnight/fix-greet"
        assert task["commit"] == git(repo, "rev-parse", "overnight/fix-greet")
        iteration = task["iterations"][0]
        assert iteration["number"] == 1 and iteration["outcome"] == "committed"
        assert iteration["turns"] == 5 and iteration["tokens"] > 0 and iteration["signals"] == []

    def test_text_report_tells_what_to_review(self, config_file, server, capsys):
        """The morning report names the task, its outcome, and the diff to review against the user's branch."""
        config = config_file()
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        capsys.readouterr()
        assert overnight("report", "--config", str(config)) == 0
        text = capsys.readouterr().out
        assert "✔ fix-greet: succeeded" in text and "git diff main...overnight/fix-greet" in text

    def test_user_checkout_is_never_touched(self, config_file, server, repo):
        """The user's branch, HEAD, and uncommitted files are exactly as before the night."""
        (repo / "greet.py").write_text("def greet():\n    return 'work in progress'\n")
        (repo / "scratch.txt").write_text("mine\n")
        before = (git(repo, "rev-parse", "HEAD"), git(repo, "branch", "--show-current"), git(repo, "status", "--porcelain"))
        config = config_file()
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        after = (git(repo, "rev-parse", "HEAD"), git(repo, "branch", "--show-current"), git(repo, "status", "--porcelain"))
        assert after == before
        assert (repo / "greet.py").read_text() == "def greet():\n    return 'work in progress'\n"
        assert (repo / "scratch.txt").read_text() == "mine\n"

    def test_text_mode_tool_calls_are_executed(self, config_file, server, repo):
        """Calls written as <tool_call> tags in prose run like native ones."""
        config = config_file()
        server.enqueue(
            say('<tool_call>{"name": "edit_file", "arguments": {"path": "greet.py", "old": "\'helo\'", "new": "\'hello\'"}}</tool_call>'),
            say('```json\n{"name": "submit", "arguments": {"summary": "done"}}\n```'),
        )
        assert overnight("run", "--config", str(config)) == 0
        assert "'hello'" in git(repo, "show", "overnight/fix-greet:greet.py")

    def test_worktree_is_reused_on_a_later_night(self, config_file, server, repo):
        """A second night continues on the same branch instead of starting over from base."""
        config = config_file()
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        first = git(repo, "rev-parse", "overnight/fix-greet")
        server.enqueue(call("submit", {"summary": "already done"}))
        assert overnight("run", "--config", str(config)) == 0
        assert git(repo, "rev-parse", "overnight/fix-greet") == first


    def test_a_night_with_nothing_to_commit_names_no_commit(self, config_file, server, repo, capsys):
        """The check passes on the branch as it was: the night made no commit, and its account names none
        (it used to give the earlier night's commit as this one's)."""
        config = config_file()
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        server.enqueue(call("submit", {"summary": "already done"}))
        assert overnight("run", "--config", str(config)) == 0
        [task] = report_json(config, capsys)["tasks"]
        assert (task["outcome"], task["commit"]) == ("succeeded", None)
        assert [(it["outcome"], it["commit"]) for it in task["iterations"]] == [("committed", None)]
        assert overnight("report", "--config", str(config)) == 0
        text = capsys.readouterr().out
        assert "#1 committed (no change: the check passed as it was)" in text and " @ " not in text

class TestRollback:
    def test_rollback_leaves_no_trace(self, config_file, server, repo):
        """Modified, new, ignored and deleted files all return to the checkpoint."""
        config = config_file(tasks=[{"name": "fix-greet", "prompt": "p", "check": "python check_greet.py", "tools": ["write_file", "edit_file", "run_command", "read_file"]}])
        server.enqueue(
            call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hullo'"}),
            call("write_file", {"path": "new/file.txt", "content": "x"}),
            call("write_file", {"path": "cache.pyc", "content": "ignored"}),
            call("run_command", {"command": "rm check_greet.py"}),
            *[call("read_file", {"path": "greet.py"})] * 4,
        )
        assert overnight("run", "--config", str(config)) == 1
        tree = worktree(config)
        assert git(tree, "status", "--porcelain", "--ignored") == ""
        assert (tree / "greet.py").read_text() == "def greet():\n    return 'helo'\n"
        assert (tree / "check_greet.py").exists()
        assert not (tree / "new").exists() and not (tree / "cache.pyc").exists()

    def test_next_prompt_carries_the_note(self, config_file, server):
        """The reason code and correction of iteration 1 appear in iteration 2's prompt."""
        config = config_file()
        server.enqueue(*[call("read_file", {"path": "greet.py"})] * 4, *FIX)
        assert overnight("run", "--config", str(config)) == 0
        notes = notes_text(config)
        assert "`repeated_tool_call`" in notes and "iteration 1" in notes
        second_first_request = next(r for r in server.requests[4:] if len(r["messages"]) == 2)
        assert "repeated_tool_call" in user_messages(second_first_request)

    def test_notes_entries_have_the_shape_reference_md_gives(self, config_file, server):
        """Each notes.md entry a night writes is reference.md's header (its `<UTC time>` as it shows one), then a
        blank line, the **Correction:** paragraph and, with evidence, **Evidence:** and a fenced block: what a
        script outside this repository parses."""
        import re
        from datetime import datetime, timezone

        reference = (Path(__file__).parent.parent / "docs" / "reference.md").read_text(encoding="utf-8")
        row = next(line for line in reference.splitlines() if line.startswith("| `notes.md` |"))
        header = re.search(r"`(## <UTC time> .*?\\`<reason>\\`)`", row).group(1).replace("\\`", "`")
        shown_time = re.search(r"`<UTC time>` to the minute, as `([^`]+)`", row).group(1)
        pattern = re.escape(header)
        for placeholder, group in (("<UTC time>", r"(?P<when>[^·\n]+)"), ("<name>", r"(?P<task>[^`\n]+)"), ("N", r"(?P<number>\d+)"), ("<reason>", r"(?P<reason>[^`\n]+)")):
            pattern = pattern.replace(re.escape(placeholder), group, 1)
        config = config_file()
        server.enqueue(*[call("read_file", {"path": "greet.py"})] * 4, call("submit", {"summary": "not yet"}))
        began = datetime.now(timezone.utc).replace(second=0, microsecond=0)
        assert overnight("run", "--config", str(config)) == 1
        text = notes_text(config)
        headers = list(re.finditer(f"^{pattern}$", text, re.MULTILINE))
        assert [(m["task"], m["number"], m["reason"]) for m in headers] == [("fix-greet", "1", "repeated_tool_call"), ("fix-greet", "2", "check_failed")]
        time_format = "%Y-%m-%d %H:%M UTC"
        datetime.strptime(shown_time, time_format)  # the reference's own example reads as the format below
        for found in headers:
            when = datetime.strptime(found["when"], time_format).replace(tzinfo=timezone.utc)
            assert began <= when <= datetime.now(timezone.utc), found["when"]
        entries = [text[a.end() : b.start() if b else len(text)] for a, b in zip(headers, [*headers[1:], None])]
        for entry in entries:
            assert re.match(r"\n\n\*\*Correction:\*\* \S", entry), entry
            assert re.search(r"\n\n\*\*Evidence:\*\*\n\n```\n.+\n```\n", entry, re.DOTALL), entry

    def test_check_failed_keeps_the_output_tail(self, config_file, server):
        """Submitting while the check fails rolls back with check_failed and the check's output as evidence."""
        config = config_file(night={"max_iterations": 1})
        server.enqueue(call("submit", {"summary": "nothing"}))
        assert overnight("run", "--config", str(config)) == 1
        notes = notes_text(config)
        assert "`check_failed`" in notes and "AssertionError" in notes


    @pytest.mark.parametrize(
        ("check", "how_it_ended"),
        [
            # A check that dies of SIGSEGV read "check failed: exit -11".
            ("kill -SEGV $$", "killed by signal 11 (SIGSEGV)"),
            # A check naming a script that is not there (bash's exit 127) read "check failed: exit 127", as a failing
            # test reads, though no change of the model's mends it.
            ("./run_the_tests.sh", "exit 127 (command not found)"),
        ],
    )
    def test_a_check_that_could_not_run_says_how_it_ended(self, config_file, server, capsys, check, how_it_ended):
        """A check killed by a signal, or whose command is not found, says so in the signal, the note and the report."""
        tasks = [{"name": "fix-greet", "prompt": "Fix greet.", "check": check}]
        config = config_file(night={"max_iterations": 1}, tasks=tasks)
        server.enqueue(call("submit", {"summary": "nothing"}))
        assert overnight("run", "--config", str(config)) == 1
        assert how_it_ended in notes_text(config)
        [signal] = report_json(config, capsys)["tasks"][0]["iterations"][0]["signals"]
        assert signal["message"] == f"check failed: {how_it_ended}"

    def test_a_long_check_output_keeps_its_end(self, config_file, server):
        """A test run's failure is at the end of its output: the note's evidence is the output's tail, not its head."""
        check = "echo FIRST-LINE; printf '%05000d\\n' 0; echo LAST-WORDS; exit 1"
        config = config_file(night={"max_iterations": 1}, tasks=[{"name": "fix-greet", "prompt": "p", "check": check}])
        server.enqueue(call("submit", {"summary": "nothing"}))
        assert overnight("run", "--config", str(config)) == 1
        notes = notes_text(config)
        assert "`check_failed`" in notes and "LAST-WORDS" in notes and "FIRST-LINE" not in notes

    def test_a_long_check_output_is_cut_at_a_line_start_and_marked(self, config_file, server):
        """The evidence of a long check output starts at a whole line after a cut marker, not with a cut line's end."""
        check = "for i in $(seq 1000 1300); do echo row-$i; done; exit 1"  # 2708 chars: the last 1200 begin inside row-1167
        config = config_file(night={"max_iterations": 1}, tasks=[{"name": "fix-greet", "prompt": "p", "check": check}])
        server.enqueue(call("submit", {"summary": "nothing"}))
        assert overnight("run", "--config", str(config)) == 1
        notes = notes_text(config)
        assert "exit 1\n[... 1512 chars cut ...]\nrow-1168\n" in notes and "row-1300" in notes, notes

    def test_a_check_that_dies_of_sigterm_on_its_own_is_check_failed(self, config_file, server, capsys):
        """Only the night's own signal makes a check's SIGTERM death a cancel: a check killed by one of its
        own (a test harness's timeout) while nothing stops the night failed, and the task is not `cancelled`."""
        tasks = [{"name": "fix-greet", "prompt": "Fix greet.", "check": "kill -TERM $$"}]
        config = config_file(night={"max_iterations": 1}, tasks=tasks)
        server.enqueue(call("submit", {"summary": "nothing"}))
        assert overnight("run", "--config", str(config)) == 1
        [task] = report_json(config, capsys)["tasks"]
        assert (task["outcome"], task["reason"]) == ("failed", "check_failed")
        assert "killed by signal 15 (SIGTERM)" in notes_text(config)

class TestFinishedWorkIsKept:
    """A guard that stops a run whose own run_check had passed, with nothing changed since, does not
    roll back finished work: the check is run as for a submission, and passing work is committed."""

    FIXED_AND_CHECKED = FIX[:4]

    @pytest.mark.parametrize(
        ("after", "reason"),
        [
            ([say("I fixed greet(); the check passes. Task complete."), say("The task is done."), say("Done.")], "no_tool_call"),
            ([call("run_check", {})] * 3, "repeated_tool_call"),
            ([call("read_file", {"path": "greet.py"})] * 4, "repeated_tool_call"),
        ],
    )
    def test_a_fix_the_model_never_submitted_is_committed(self, config_file, server, repo, capsys, after, reason):
        config = config_file(night={"max_iterations": 1})
        server.enqueue(*self.FIXED_AND_CHECKED, *after)
        assert overnight("run", "--config", str(config), "--log-format", "json") == 0
        [stopped] = [json.loads(line) for line in capsys.readouterr().err.splitlines() if '"stopped_after_passing_check"' in line]
        assert (stopped["reason"], stopped["task"], stopped["iteration"]) == (reason, "fix-greet", 1)
        assert isinstance(stopped["run_id"], int) and isinstance(stopped["iteration_id"], int)
        assert "return 'hello'" in git(repo, "show", "overnight/fix-greet:greet.py")
        assert "(not submitted: " in git(repo, "log", "-1", "--format=%B", "overnight/fix-greet")
        [iteration] = report_json(config, capsys)["tasks"][0]["iterations"]
        assert iteration["outcome"] == "committed" and iteration["reason"] in ("", None)
        assert iteration["signals"][-1]["level"] == "severe" and iteration["signals"][-1]["kind"] == reason
        assert f"`{reason}`" not in notes_text(config)

    def test_a_change_after_the_passing_check_rolls_back_as_before(self, config_file, server, repo, capsys):
        """A write after the model's passing run_check: what the guard stopped is not known to pass."""
        config = config_file(night={"max_iterations": 1})
        server.enqueue(
            *FIX[2:4], call("write_file", {"path": "extra.txt", "content": "x"}), *[call("read_file", {"path": "greet.py"})] * 4
        )
        assert overnight("run", "--config", str(config)) == 1
        assert _reason_of_first_iteration(config, capsys)[0] == "repeated_tool_call"
        assert (worktree(config) / "greet.py").read_text() == "def greet():\n    return 'helo'\n"

    def test_the_guards_reason_stands_when_the_check_fails_after_all(self, config_file, server, repo, capsys, tmp_path):
        """The model's run_check passed, the night's own run of the check fails (a flaky check): rolled back
        with the guard's reason, not check_failed, and its note."""
        once = tmp_path / "passed-once"
        tasks = [{"name": "fix-greet", "prompt": "Fix greet.", "check": f"python check_greet.py && ! test -e {once} && touch {once}"}]
        config = config_file(night={"max_iterations": 1}, tasks=tasks)
        server.enqueue(*self.FIXED_AND_CHECKED, *[say("Done.")] * 3)
        assert overnight("run", "--config", str(config)) == 1
        assert once.exists()
        assert _reason_of_first_iteration(config, capsys)[0] == "no_tool_call"
        assert "`no_tool_call`" in notes_text(config)
        assert (worktree(config) / "greet.py").read_text() == "def greet():\n    return 'helo'\n"


def _reason_of_first_iteration(config: Path, capsys: Any) -> tuple[str, list[dict[str, str]]]:
    iteration = report_json(config, capsys)["tasks"][0]["iterations"][0]
    return iteration["reason"], iteration["signals"]


class TestReasonCodes:
    @pytest.mark.parametrize(
        ("script", "reason"),
        [
            ([say(""), say("")], "empty_response"),
            ([call("rm_rf", {}), call("rm_rf", {})], "unknown_tool"),
            ([call("", {}), call("", {})], "empty_tool_name"),
            ([call("read_file", '{"pth": "a.py"}'), call("read_file", "}{ path => x ;; ]["), call("read_file", "{}")], "broken_tool_call"),
            ([call("read_file", {"path": "greet.py"})] * 4, "repeated_tool_call"),
        ],
    )
    def test_each_struggle_rolls_back_with_its_reason(self, config_file, server, capsys, script, reason):
        """Each struggle ends the iteration with its exact reason code in the report and notes.md."""
        config = config_file(night={"max_iterations": 1})
        server.enqueue(*script)
        assert overnight("run", "--config", str(config)) == 1
        found, signals = _reason_of_first_iteration(config, capsys)
        assert found == reason
        assert signals[-1]["level"] == "severe" and signals[-1]["kind"] == reason
        assert f"`{reason}`" in notes_text(config)

    def test_max_turns(self, config_file, server, capsys):
        """Running out of turns without submitting is max_turns, after every one of the turns allowed was answered."""
        config = config_file(night={"max_iterations": 1, "max_turns": 3})
        server.enqueue(*[call("read_file", {"path": p}) for p in ("greet.py", "check_greet.py", ".gitignore")])
        assert overnight("run", "--config", str(config)) == 1
        iteration = report_json(config, capsys)["tasks"][0]["iterations"][0]
        assert (iteration["reason"], iteration["turns"]) == ("max_turns", 3)

    def test_watchdog_timeout(self, config_file, server, capsys):
        """A model silent for longer than request_timeout_s stops the iteration with watchdog_timeout."""
        config = config_file(night={"max_iterations": 1}, model={"request_timeout_s": 1})
        server.enqueue(Reply(text="thinking", stall_s=3))
        assert overnight("run", "--config", str(config)) == 1
        assert _reason_of_first_iteration(config, capsys)[0] == "watchdog_timeout"

    def test_broken_arguments_are_never_sent_back_as_tool_calls(self, config_file, server):
        """A call whose arguments did not parse reaches the next request as a note, not as a tool call."""
        config = config_file(night={"max_iterations": 1})
        server.enqueue(call("read_file", "}{ path => x ;; ]["), *FIX[2:])
        assert overnight("run", "--config", str(config)) == 0
        second = server.requests[1]["messages"]
        assert not any(m.get("tool_calls") for m in second)
        assert "was not run" in user_messages(server.requests[1])

    def test_repaired_arguments_go_back_as_valid_json(self, config_file, server):
        """A call cut short but repairable runs, and the history holds the repaired JSON, not the broken text."""
        config = config_file(night={"max_iterations": 1})
        server.enqueue(call("read_file", '{"path": "greet.py"'), *FIX[2:])
        assert overnight("run", "--config", str(config)) == 0
        [sent] = [m for m in server.requests[1]["messages"] if m.get("tool_calls")]
        assert json.loads(sent["tool_calls"][0]["function"]["arguments"]) == {"path": "greet.py"}

    def test_arguments_that_end_mid_value_are_not_run(self, config_file, server):
        """An edit whose arguments stop where its new text was due is not run as an edit to "" (the file keeps
        its text): the model is told, writes the call again, and its fix passes the check."""
        config = config_file(night={"max_iterations": 1})
        server.enqueue(call("edit_file", """{"path": "greet.py", "old": "'helo'", "new": """), *FIX[2:])
        assert overnight("run", "--config", str(config)) == 0
        assert "end in the middle of a value" in user_messages(server.requests[1])
        assert "'hello'" in git(worktree(config), "show", "HEAD:greet.py")

    def test_native_arguments_holding_two_objects_run_as_two_calls(self, config_file, server):
        """Native arguments that hold two whole objects one after another (two calls' arguments run together) are
        two calls: both run, and the next request carries both, each with its own id answered by its own result."""
        config = config_file(night={"max_iterations": 1})
        two = '{"path": "greet.py"}{"path": "absent.py"}'
        server.enqueue(call("read_file", two), *FIX[2:])
        assert overnight("run", "--config", str(config)) == 0
        messages = server.requests[1]["messages"]
        [sent] = [m for m in messages if m.get("tool_calls")]
        ids = [one["id"] for one in sent["tool_calls"]]
        assert [json.loads(one["function"]["arguments"]) for one in sent["tool_calls"]] == [{"path": "greet.py"}, {"path": "absent.py"}]
        assert len(set(ids)) == 2 and all(ids)
        results = [m for m in messages if m.get("role") == "tool"]
        assert [m["tool_call_id"] for m in results] == ids
        assert "'helo'" in results[0]["content"] and "file not found: 'absent.py'" in results[1]["content"]

    def test_model_unreachable_exits_3_without_blame(self, tmp_path, repo, capsys):
        """A dead endpoint is infrastructure: exit 3, no note in notes.md, the task paused, its iteration's reason model_unreachable."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        from tests.conftest import write_config

        config = write_config(tmp_path / "overnight.toml", api_base=f"http://127.0.0.1:{port}/v1", repo=repo)
        assert overnight("run", "--config", str(config)) == 3
        assert "`model_unreachable`" not in notes_text(config)
        task = report_json(config, capsys)["tasks"][0]
        assert task["outcome"] == "paused" and task["reason"] == "model_unreachable"
        # No answer came: no turn (it said 1).
        assert [(it["outcome"], it["reason"], it["turns"]) for it in task["iterations"]] == [("rolled_back", "model_unreachable", 0)]


    def test_a_server_that_goes_down_mid_iteration_leaves_the_worktree_at_its_checkpoint(self, config_file, server, repo, capsys):
        """The model edited a file, then the endpoint died (5xx through every retry): the task is paused
        without blame, and the half-done edit is rolled back like any other. Left in place, the next
        night's recovery would take it for a person's edits and keep it on an `overnight-kept/` branch."""
        config = config_file(model={"retries": 1})
        server.enqueue(
            call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'half'"}),
            call("write_file", {"path": "scratch.txt", "content": "x"}),
            *[Reply(status=503)] * 2,
        )
        assert overnight("run", "--config", str(config)) == 3
        task = report_json(config, capsys)["tasks"][0]
        assert (task["outcome"], task["reason"]) == ("paused", "model_unreachable")
        tree = worktree(config)
        assert git(tree, "status", "--porcelain", "--ignored") == ""
        assert (tree / "greet.py").read_text() == "def greet():\n    return 'helo'\n"

    def test_a_wedged_server_pauses_the_task_without_blaming_the_model(self, tmp_path, repo, capsys):
        """A server stopped (SIGSTOP) or wedged: the kernel takes the connection, nothing answers. Its
        silence was watchdog_timeout, noted as the model's ("keep each reply short") and the task
        parked, exit 1 (found by a review): it is an outage, retried and then paused, exit 3."""
        from tests.conftest import write_config

        with socket.socket() as wedged:  # listening, never accepting: every connection waits in the backlog
            wedged.bind(("127.0.0.1", 0))
            wedged.listen(16)
            port = wedged.getsockname()[1]
            config = write_config(tmp_path / "overnight.toml", api_base=f"http://127.0.0.1:{port}/v1", repo=repo,
                                  model={"request_timeout_s": 0.5})
            capsys.readouterr()
            assert overnight("run", "--config", str(config), "--log-format", "json") == 3
        events = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
        [unreachable] = [e for e in events if e["event"] == "iteration_model_unreachable"]
        assert "answered no GET / in 0.5 s (stopped, wedged or gone)" in unreachable["detail"]
        assert "watchdog_timeout" not in notes_text(config)
        task = report_json(config, capsys)["tasks"][0]
        assert task["outcome"] == "paused" and task["reason"] == "model_unreachable"

    def test_the_task_finished_event_counts_an_iteration_that_ended_without_a_report(self, tmp_path, repo, capsys):
        """An iteration cut short by an unreachable model (or a cancel) ends by raising: the log's
        count of the task's iterations still says what the report says."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        from tests.conftest import write_config

        config = write_config(tmp_path / "overnight.toml", api_base=f"http://127.0.0.1:{port}/v1", repo=repo)
        capsys.readouterr()
        assert overnight("run", "--config", str(config), "--log-format", "json") == 3
        events = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
        [finished] = [e for e in events if e["event"] == "task_finished"]
        assert (finished["outcome"], finished["iterations"]) == ("paused", len(report_json(config, capsys)["tasks"][0]["iterations"])) == ("paused", 1)

class TestBrokenNight:
    def test_a_task_whose_worktree_cannot_be_made_ends_the_run_as_crashed(self, config_file, server, repo, capsys):
        """Exit 2 with one line; the task before it is committed, and the morning report says `crashed`, not `running`."""
        tasks = [
            {"name": "fix-greet", "prompt": "greet() should return 'hello'.", "check": "python check_greet.py"},
            {"name": "blocked", "prompt": "p", "check": "true"},
        ]
        config = config_file(tasks=tasks)
        (config.parent / "state" / "worktrees").mkdir(parents=True)
        (config.parent / "state" / "worktrees" / "blocked").write_text("a file where the worktree would go\n")
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("overnight: error: cannot create the worktree of task 'blocked'") and "already exists" in err[-1]
        assert "branch" not in err[-1]  # the cause is the file in the way, not the branch the first try made
        assert git(repo, "branch", "--list", "overnight/blocked") == ""  # nor is that branch left behind
        report = report_json(config, capsys)
        assert (report["run"]["status"], report["run"]["exit_code"]) == ("crashed", 2)  # the code the process left with
        outcomes = {task["name"]: (task["outcome"], task["reason"]) for task in report["tasks"]}
        assert outcomes == {"fix-greet": ("succeeded", ""), "blocked": ("failed", "interrupted")}
        assert "return 'hello'" in git(repo, "show", "overnight/fix-greet:greet.py")


class TestMorning:
    def test_notes_command_filters_by_task(self, config_file, server, capsys):
        """`overnight notes --task` prints only that task's entries."""
        tasks = [
            {"name": "one", "prompt": "p", "check": "false"},
            {"name": "two", "prompt": "p", "check": "false"},
        ]
        config = config_file(tasks=tasks, night={"max_iterations": 1})
        server.enqueue(call("submit", {"summary": "a"}), call("submit", {"summary": "b"}))
        assert overnight("run", "--config", str(config)) == 1
        capsys.readouterr()
        assert overnight("notes", "--config", str(config), "--task", "two") == 0
        out = capsys.readouterr().out
        assert "task `two`" in out and "task `one`" not in out

    def test_notes_for_a_task_nobody_knows_is_a_usage_error(self, config_file, server, capsys):
        """`--task tow` (misspelt) printed "(no notes for task 'tow')" and exit 0, which reads as a task that
        never failed: one line naming the tasks, exit 2. A task of the config without notes, and one no longer
        in the config that notes.md still has, are no error."""
        config = config_file(tasks=[{"name": "one", "prompt": "p", "check": "false"}], night={"max_iterations": 1})
        server.enqueue(call("submit", {"summary": "a"}))
        assert overnight("run", "--config", str(config)) == 1
        config.write_text(config.read_text().replace('name = "one"', 'name = "two"'))
        capsys.readouterr()
        assert overnight("notes", "--config", str(config), "--task", "tow") == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--task 'tow'" in err and "(tasks: two)" in err
        assert overnight("notes", "--config", str(config), "--task", "two") == 0
        assert "(no notes for task 'two')" in capsys.readouterr().out
        assert overnight("notes", "--config", str(config), "--task", "one") == 0
        assert "task `one`" in capsys.readouterr().out

    def test_transcript_records_the_iteration(self, config_file, server):
        """Each iteration leaves a JSONL transcript with its messages and tool calls."""
        config = config_file()
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        [path] = (config.parent / "state" / "transcripts").glob("*.jsonl")
        kinds = [json.loads(line)["entry"] for line in path.read_text().splitlines()]
        assert kinds.count("tool_call") == 5 and "check" in kinds


class TestOddCharacters:
    def test_lone_surrogates_from_the_model_end_nowhere_near_a_crash(self, config_file, server, capsys):
        """Half a surrogate pair ("\\ud83d": an escape a small model writes in code, or a pair split
        across stream chunks) in the text or the arguments is written down as its escape: the
        transcript, the run store, notes.md and the report all take it, and the night goes on."""
        config = config_file(night={"max_iterations": 1})
        server.enqueue(
            say("thinking about \ud83d"),
            call("write_file", '{"path": "u.py", "content": "S = \\"\\ud83d\\"\\n"}'),
            call("read_file", {"path": "nope-\ud83d.py"}),
            *FIX[2:],
        )
        assert overnight("run", "--config", str(config)) == 0
        assert (worktree(config) / "u.py").read_text(encoding="utf-8") == 'S = "\\ud83d"\n'
        report = report_json(config, capsys)
        assert report["tasks"][0]["outcome"] == "succeeded"
        [path] = (config.parent / "state" / "transcripts").glob("*.jsonl")
        lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        assert any("nope-" in json.dumps(line) for line in lines)

    def test_a_summary_with_a_nul_still_commits_the_passing_fix(self, config_file, server, repo, capsys):
        """A submit summary holding a NUL (or a terminal escape): the fix had passed its check, and the commit
        failed ("embedded null byte": no command line carries one), so it was rolled back as iteration_error.
        Committed, the summary's control characters written as their escapes."""
        config = config_file(night={"max_iterations": 1})
        server.enqueue(FIX[2], call("submit", {"summary": "fixed\u0000 the \x1b[2Jtypo\nline two"}))
        assert overnight("run", "--config", str(config)) == 0
        [task] = report_json(config, capsys)["tasks"]
        assert [(i["outcome"], i["reason"]) for i in task["iterations"]] == [("committed", None)]
        assert git(repo, "show", "overnight/fix-greet:greet.py").endswith("'hello'")
        message = git(repo, "log", "-1", "--format=%B", "overnight/fix-greet")
        assert message == "overnight: fix-greet iteration 1\n\nfixed\\x00 the \\x1b[2Jtypo\nline two"


    def test_a_summary_longer_than_a_command_line_argument_still_commits_the_passing_fix(self, config_file, server, repo, capsys):
        """A 200 kB submit summary (a model allowed long answers): the fix had passed its check and the commit failed, past
        what one argument of git's command line can carry. Committed, the summary shortened in its message."""
        config = config_file(night={"max_iterations": 1}, guards={"max_output_chars": 400_000})
        server.enqueue(FIX[2], call("submit", {"summary": "fixed the typo " + " ".join(f"then step {n}," for n in range(15_000))}))
        assert overnight("run", "--config", str(config)) == 0
        [task] = report_json(config, capsys)["tasks"]
        assert [(i["outcome"], i["reason"]) for i in task["iterations"]] == [("committed", None)]
        message = git(repo, "log", "-1", "--format=%B", "overnight/fix-greet")
        assert message.startswith("overnight: fix-greet iteration 1\n\nfixed the typo then step 0,") and message.endswith("…")
        assert len(message) < 10_000

class TestTheBranchUnderReview:
    """The morning's review, as git asks for it: detach the task's worktree, check its branch out in
    your own checkout, commit a fixup there (an outside review found the next night then moved the
    person's checkout under them, or dropped their commit from the branch)."""

    def _reviewed(self, config: Path, server: Any, repo: Path, *more: Reply) -> str:
        server.enqueue(*FIX, *more)
        assert overnight("run", "--config", str(config)) == 0
        git(worktree(config), "checkout", "--quiet", "--detach")
        git(repo, "checkout", "--quiet", "overnight/fix-greet")
        (repo / "review.txt").write_text("reviewed\n")
        git(repo, "add", "review.txt")
        git(repo, "commit", "--quiet", "-m", "user review fixup")
        return git(repo, "rev-parse", "HEAD")

    def test_a_branch_checked_out_in_the_users_checkout_skips_the_task(self, config_file, server, repo, capsys):
        """The task is skipped (`branch_checked_out`, exit 1, the checkout named); the user's HEAD, branch,
        commit and files stay as they were; the night's other tasks run."""
        config = config_file(tasks=[
            {"name": "fix-greet", "prompt": "greet() should return 'hello'.", "check": "python check_greet.py"},
            {"name": "other", "prompt": "p", "check": "true"},
        ])
        fixup = self._reviewed(config, server, repo, call("submit", {"summary": "done"}))
        (worktree(config) / "greet.py").write_text("# a note in the detached worktree\n")
        # Two: the skipped task's first request had left already (it leaves while the worktree is made).
        server.enqueue(call("submit", {"summary": "done"}), call("submit", {"summary": "done"}))
        capsys.readouterr()
        assert overnight("run", "--config", str(config), "--log-format", "json") == 1
        events = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
        # The log says where the branch is out, and that the answer asked ahead was spent for nothing.
        [skipped] = [e for e in events if e["event"] == "task_skipped_branch_checked_out"]
        assert (skipped["task"], Path(skipped["at"]), isinstance(skipped["run_id"], int)) == ("fix-greet", repo, True)
        [unused] = [e for e in events if e["event"] == "first_answer_unused"]
        assert (unused["task"], unused["run_id"]) == ("fix-greet", skipped["run_id"]) and unused["tokens"] > 0
        # A task's event carries its task run's id, as the task's other events do (reference.md; it had the name alone).
        assert isinstance(skipped["task_run_id"], int) and unused["task_run_id"] == skipped["task_run_id"]
        assert (worktree(config) / "greet.py").read_text() == "# a note in the detached worktree\n"
        assert git(repo, "symbolic-ref", "HEAD") == "refs/heads/overnight/fix-greet"
        assert git(repo, "rev-parse", "overnight/fix-greet") == fixup
        assert git(repo, "status", "--porcelain") == ""
        tasks = {t["name"]: t for t in report_json(config, capsys)["tasks"]}
        assert (tasks["fix-greet"]["outcome"], tasks["fix-greet"]["reason"]) == ("skipped", "branch_checked_out")
        assert tasks["other"]["outcome"] == "succeeded"
        # Once the checkout is switched back, the task's worktree takes up the branch where the person left it.
        git(repo, "checkout", "--quiet", "main")
        server.enqueue(call("write_file", {"path": "more.txt", "content": "x\n"}), call("submit", {"summary": "more"}), call("submit", {"summary": "done"}))
        assert overnight("run", "--config", str(config)) == 0
        assert git(repo, "rev-parse", "overnight/fix-greet^") == fixup
        assert git(repo, "show", "overnight/fix-greet:review.txt") == "reviewed"

    def test_the_first_answer_a_skipped_task_left_unused_is_in_the_reports_tokens(self, config_file, server, repo, capsys):
        """The tokens of a first answer the skipped task never took, which the log and the night's budget count, are the task's and the night's in `report --json` and the text report."""
        config = config_file(tasks=[
            {"name": "fix-greet", "prompt": "greet() should return 'hello'.", "check": "python check_greet.py"},
            {"name": "other", "prompt": "p", "check": "true"},
        ])
        self._reviewed(config, server, repo, call("submit", {"summary": "done"}))
        server.enqueue(
            call("submit", {"summary": "done"}, prompt_tokens=1000, completion_tokens=100),  # fix-greet's, asked ahead
            call("submit", {"summary": "done"}, prompt_tokens=200, completion_tokens=20),
        )
        capsys.readouterr()
        assert overnight("run", "--config", str(config), "--log-format", "json") == 1
        events = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
        [unused] = [e for e in events if e["event"] == "first_answer_unused"]
        assert (unused["task"], unused["tokens"]) == ("fix-greet", 1100)
        report = report_json(config, capsys)
        tasks = {t["name"]: t for t in report["tasks"]}
        assert (tasks["fix-greet"]["tokens"], tasks["fix-greet"]["unused_tokens"], tasks["fix-greet"]["iterations"]) == (1100, 1100, [])
        assert [i["tokens"] for i in tasks["other"]["iterations"]] == [220]
        assert (tasks["other"]["tokens"], tasks["other"]["unused_tokens"]) == (220, 0)
        assert report["run"]["tokens"] == 1320
        assert overnight("report", "--config", str(config)) == 0
        text = capsys.readouterr().out
        assert text.splitlines()[0].endswith(" · 1320 tokens")
        [skipped] = [line for line in text.splitlines() if line.startswith("↷ fix-greet")]
        assert "1100 tokens in a first answer no iteration took (1100 in all)" in skipped

    def test_a_branch_checked_out_beside_the_task_worktree_skips_the_task(self, config_file, server, repo, capsys):
        """`git checkout --ignore-other-worktrees overnight/<task>` in the user's checkout, the task's worktree
        still on the branch: skipped as well. The night committed on the branch under the user's checkout,
        which then showed the night's change undone as staged."""
        config = config_file()
        server.enqueue(say(""), say(""), say(""), say(""))
        overnight("run", "--config", str(config))
        git(repo, "checkout", "--quiet", "--ignore-other-worktrees", "overnight/fix-greet")
        tip = git(repo, "rev-parse", "HEAD")
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 1
        [task] = report_json(config, capsys)["tasks"]
        assert (task["outcome"], task["reason"]) == ("skipped", "branch_checked_out")
        assert git(repo, "rev-parse", "overnight/fix-greet") == tip and git(repo, "status", "--porcelain") == ""

    def test_a_deleted_review_worktree_git_still_registers_holds_nothing(self, config_file, server, repo, tmp_path):
        """A person's second worktree on the branch, its folder deleted without `git worktree prune`: no checkout
        has the branch, and the task runs (it was skipped, naming a folder that no longer exists)."""
        import shutil

        config = config_file()
        server.enqueue(say(""), say(""), say(""), say(""))
        overnight("run", "--config", str(config))
        git(repo, "worktree", "add", "--quiet", "-f", str(tmp_path / "review"), "overnight/fix-greet")
        shutil.rmtree(tmp_path / "review")
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0

    def test_a_reviewed_branch_is_built_on_not_undone(self, config_file, server, repo):
        """The checkout switched back after the fixup: the night's worktree, still detached at its old
        commit, is put on the branch's tip; its commit keeps the person's, and a rollback does not drop it."""
        config = config_file()
        fixup = self._reviewed(config, server, repo)
        git(repo, "checkout", "--quiet", "main")
        server.enqueue(call("write_file", {"path": "more.txt", "content": "x\n"}), call("submit", {"summary": "more"}))
        assert overnight("run", "--config", str(config)) == 0
        assert git(repo, "rev-parse", "overnight/fix-greet^") == fixup
        assert git(repo, "show", "overnight/fix-greet:review.txt") == "reviewed"
        # A rolled-back iteration leaves the branch where it was.
        tip = git(repo, "rev-parse", "overnight/fix-greet")
        git(worktree(config), "checkout", "--quiet", "--detach", "HEAD^^")
        server.enqueue(say(""), say(""), say(""), say(""))
        overnight("run", "--config", str(config))
        assert git(repo, "rev-parse", "overnight/fix-greet") == tip

    def test_a_task_worktree_removed_while_its_branch_is_checked_out_is_skipped_too(self, config_file, server, repo, capsys):
        """No worktree to detach: `git worktree add` refuses the branch; the same skip, not a night-ending error."""
        config = config_file()
        fixup = self._reviewed(config, server, repo)
        git(repo, "worktree", "remove", "--force", str(worktree(config)))
        assert overnight("run", "--config", str(config)) == 1
        [task] = report_json(config, capsys)["tasks"]
        assert (task["outcome"], task["reason"]) == ("skipped", "branch_checked_out")
        assert git(repo, "rev-parse", "HEAD") == fixup


def _a_fix_with_a_dump(config_file: Any, server: Any, *, dump_bytes: int) -> Path:
    """A config with `[repo] max_file_mb = 2` whose model fixes greet.py, writes a dump.bin of `dump_bytes`, and submits."""
    config = config_file(night={"max_iterations": 1, "max_turns": 8}, extra="")
    text = config.read_text().replace('path = "', 'max_file_mb = 2\npath = "', 1)
    config.write_text(text.replace('check = "python check_greet.py"', 'check = "python check_greet.py"\ntools = ["edit_file", "run_command", "submit"]'))
    server.enqueue(
        call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}),
        call("run_command", {"command": f"head -c {dump_bytes} /dev/zero > dump.bin"}),
        call("submit", {"summary": "fixed"}),
    )
    return config


class TestWorkNoCommitHolds:
    """Work the check passed on must be on the branch, or the night must say it is not (an outside
    review found both of these reported `succeeded` with the edit on no commit)."""

    def test_a_file_written_outside_a_sparse_checkout_is_committed(self, config_file, server, repo, capsys):
        (repo / "docs").mkdir()
        (repo / "docs" / "guide.md").write_text("old\n")
        git(repo, "add", "docs")
        git(repo, "commit", "-q", "-m", "docs")
        config = config_file(tasks=[{"name": "docs", "prompt": "p", "check": "grep -q new docs/guide.md"}])
        state = config.parent / "state"
        # The task's worktree checked out sparse (a monorepo's habit), docs/ outside it.
        from orchestrator.worktree import Worktree

        tree = Worktree.ensure(repo, state, "docs", "HEAD")
        git(tree.path, "sparse-checkout", "set", "--no-cone", "/*.py")
        assert not (tree.path / "docs" / "guide.md").exists()
        server.enqueue(call("write_file", {"path": "docs/guide.md", "content": "new\n"}), call("submit", {"summary": "s"}))
        assert overnight("run", "--config", str(config)) == 0
        assert git(repo, "show", "overnight/docs:docs/guide.md") == "new"

    def test_a_file_over_the_size_limit_is_not_committed(self, config_file, server, repo, capsys):
        """A 3 MB dump with `[repo] max_file_mb = 2`: the iteration is rolled back (`file_too_large`, a severe signal,
        a note naming the file); the branch and the worktree hold none of it. It was committed, and went into the
        user's repository with the branch."""
        config = _a_fix_with_a_dump(config_file, server, dump_bytes=3_000_000)
        assert overnight("run", "--config", str(config)) == 1
        [task] = report_json(config, capsys)["tasks"]
        [iteration] = task["iterations"]
        assert (iteration["outcome"], iteration["reason"]) == ("rolled_back", "file_too_large")
        assert iteration["worst_signal"]["kind"] == "file_too_large"
        assert "dump.bin (3.0 MB)" in notes_text(config)
        assert "dump.bin" not in git(repo, "ls-tree", "-r", "--name-only", "overnight/fix-greet")
        assert not (worktree(config) / "dump.bin").exists()

    def test_a_file_just_over_the_limit_is_noted_by_a_size_that_reads_as_over_it(self, config_file, server, repo):
        """With `max_file_mb = 2`, a 2,040,000-byte dump is noted as its bytes: "Files over 2 MB are not
        committed: dump.bin (2.0 MB)" told the model and the person that a file within the limit was refused."""
        config = _a_fix_with_a_dump(config_file, server, dump_bytes=2_040_000)
        assert overnight("run", "--config", str(config)) == 1
        notes = notes_text(config)
        assert "Files over 2 MB are not committed: dump.bin (2,040,000 bytes)" in notes and "(2.0 MB)" not in notes

    def test_build_output_under_a_keep_path_is_not_committed(self, config_file, server, repo, capsys):
        """`[repo] keep = [".venv"]`, a check that makes its .venv (not in .gitignore): the fix is committed,
        the .venv is not (it went onto the branch, and into the morning's merge; a file there over
        `max_file_mb`, a wheel's library, rolled back every passing iteration as file_too_large), and stays
        for the next iteration as a rollback leaves it. A tracked file under a keep path the agent changes is still work."""
        (repo / "vendor").mkdir()
        (repo / "vendor" / "lib.py").write_text("x = 1\n")
        git(repo, "add", "vendor")
        git(repo, "commit", "-q", "-m", "vendor")
        config = config_file(tasks=[{"name": "fix-greet", "prompt": "p",
                                     "check": "mkdir -p .venv/bin vendor/cache && head -c 3000 /dev/zero > .venv/bin/tool && echo c > vendor/cache/c && python check_greet.py"}])
        config.write_text(config.read_text().replace('path = "', 'keep = [".venv", "vendor"]\nmax_file_mb = 0.002\npath = "', 1))
        server.enqueue(
            call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}),
            call("edit_file", {"path": "vendor/lib.py", "old": "x = 1", "new": "x = 2"}),
            call("submit", {"summary": "fixed"}),
        )
        assert overnight("run", "--config", str(config)) == 0
        committed = git(repo, "diff", "--name-only", "main", "overnight/fix-greet").splitlines()
        assert committed == ["greet.py", "vendor/lib.py"]
        assert (worktree(config) / ".venv" / "bin" / "tool").exists()
        assert (worktree(config) / "vendor" / "cache" / "c").exists()

    def test_a_limit_under_a_byte_is_still_a_limit(self, config_file, server, repo, capsys):
        """`max_file_mb = 0.0000005` (half a byte) was rounded down to 0 bytes, which means no limit: the fix
        was committed. A positive limit is at least one byte."""
        config = config_file(night={"max_iterations": 1, "max_turns": 8}, extra="")
        config.write_text(config.read_text().replace('path = "', 'max_file_mb = 0.0000005\npath = "', 1))
        server.enqueue(call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}), call("submit", {"summary": "fixed"}))
        assert overnight("run", "--config", str(config)) == 1
        [task] = report_json(config, capsys)["tasks"]
        assert [(i["outcome"], i["reason"]) for i in task["iterations"]] == [("rolled_back", "file_too_large")]

    def test_an_edit_inside_a_submodule_is_no_success(self, config_file, server, repo, tmp_path, capsys):
        """The check passed on an edit inside a checked-out submodule, which no commit of the task's can
        hold: the iteration is rolled back (the submodule's files too) with a note saying why, not `succeeded`."""
        library = make_repo(tmp_path / "library", {"lib.py": "x = 1\n"})
        git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(library), "vendor/lib")
        git(repo, "commit", "-q", "-m", "vendor lib")
        config = config_file(
            tasks=[{"name": "lib", "prompt": "p", "check": "grep -q 'x = 2' vendor/lib/lib.py"}], night={"max_iterations": 1}
        )
        from orchestrator.worktree import Worktree

        tree = Worktree.ensure(repo, config.parent / "state", "lib", "HEAD")
        git(tree.path, "-c", "protocol.file.allow=always", "submodule", "update", "-q", "--init")
        server.enqueue(call("write_file", {"path": "vendor/lib/lib.py", "content": "x = 2\n"}), call("submit", {"summary": "s"}))
        assert overnight("run", "--config", str(config)) == 1
        [task] = report_json(config, capsys)["tasks"]
        assert (task["outcome"], task["reason"], task["commit"]) == ("failed", "iteration_error", None)
        assert "submodule" in notes_text(config) and "vendor/lib" in notes_text(config)
        assert (tree.path / "vendor" / "lib" / "lib.py").read_text() == "x = 1\n"
        assert git(repo, "rev-parse", "overnight/lib") == git(repo, "rev-parse", "main")


class TestContextWindow:
    @pytest.mark.parametrize("transport", ["direct", "litellm"])
    @pytest.mark.parametrize(
        ("status", "refusal"),
        [
            (500, "context shift is disabled"),  # llama.cpp before its exceed_context_size_error
            (400, "The decoder prompt (length 5000) is longer than the maximum model length of 4096."),  # vLLM's V1 engine
            (500, "input (5000 tokens) is too large to process. increase the physical batch size (current batch size: 2048)"),  # llama.cpp
        ],
    )
    def test_a_refused_long_prompt_is_the_models_struggle_and_the_next_iteration_starts_short(
        self, tmp_path, repo, capsys, transport, status, refusal
    ):
        """A server refusing a prompt past its window in its older wordings is context_overflow: asked once (the
        same request cannot fit a second time), the half-done edit rolled back, a note to read less, and the next
        iteration starts from the task alone. It was retried as an outage until the task paused (500), or ended
        the iteration as iteration_error (400)."""
        from orchestrator.fake_server import ScriptedServer
        from tests.conftest import write_config

        requests: list[dict[str, Any]] = []

        def respond(body: dict[str, Any]) -> Reply:
            """The first iteration's conversation, once it holds a tool result, no longer fits; the next one's does."""
            requests.append(body)
            results = sum(1 for m in body["messages"] if m["role"] == "tool")
            if "Read less at once" in user_messages(body):
                return FIX[results]
            if results:
                return Reply(status=status, text=refusal)
            return call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'half'"})

        with ScriptedServer(responder=respond) as server:
            config = write_config(
                tmp_path / "overnight.toml", api_base=server.url, repo=repo, model={"transport": transport, "retries": 2}
            )
            assert overnight("run", "--config", str(config)) == 0
        task = report_json(config, capsys)["tasks"][0]
        assert [(it["outcome"], it["reason"]) for it in task["iterations"]][0] == ("rolled_back", "context_overflow")
        assert len(requests) == 2 + len(FIX)
        assert "`context_overflow`" in notes_text(config)
        assert [m["role"] for m in requests[2]["messages"]] == ["system", "user"]
        assert "return 'hello'" in git(repo, "show", "overnight/fix-greet:greet.py")

    def test_an_answer_the_server_ended_at_the_windows_end_is_context_overflow(self, config_file, server, repo, capsys):
        """llama.cpp ends an answer that fills n_ctx with finish_reason "length", as at max_tokens: one ended after
        40 of the 1024 tokens asked, its prompt and answer reaching the 4096 tokens /props says the slot holds, is
        the window full (context_overflow, rolled back, noted), not a broken call the model is told to write again
        in a conversation that has no room left."""
        server.props = {"default_generation_settings": {"n_ctx": 4096}}
        config = config_file()
        server.enqueue(
            call("read_file", {"path": "greet.py"}),
            call("edit_file", '{"path": "greet.py", "old": "\'helo\'", "new": ', finish_reason="length",
                 prompt_tokens=4056, completion_tokens=40),
            *FIX,
        )
        assert overnight("run", "--config", str(config)) == 0
        first = report_json(config, capsys)["tasks"][0]["iterations"][0]
        assert (first["outcome"], first["reason"]) == ("rolled_back", "context_overflow")
        assert first["tokens"] >= 4096  # the answer the window cut still cost its prompt and tokens
        assert "after 40 of the 1024 tokens asked" in notes_text(config)
        assert "4096 of the 4096-token context window" in notes_text(config)
        assert [m["role"] for m in server.requests[2]["messages"]] == ["system", "user"]

    def test_an_answer_cut_by_the_servers_own_cap_is_still_the_models(self, config_file, server, repo, capsys):
        """llama-server started with `-n 40` caps every request's max_tokens at 40 and ends the answer with "length"
        while its 8192-token slot has room: the cut call is the model's to write again (as before the window rule),
        not context_overflow throwing the iteration's work away with a note to read less."""
        server.props = {"default_generation_settings": {"n_ctx": 8192}}
        config = config_file(night={"max_iterations": 1})
        server.enqueue(
            call("read_file", {"path": "greet.py"}),
            call("edit_file", '{"path": "greet.py", "old": "\'helo\'", "new": ', finish_reason="length",
                 prompt_tokens=900, completion_tokens=40),
            *FIX[2:],
        )
        assert overnight("run", "--config", str(config)) == 0
        first = report_json(config, capsys)["tasks"][0]["iterations"][0]
        assert first["outcome"] == "committed"
        assert "cut off at the length limit" in user_messages(server.requests[2])

    def test_an_answer_ended_at_max_tokens_is_still_the_models(self, config_file, server, repo, capsys):
        """An answer that used every token asked is cut by max_tokens: the model's, as before, never context_overflow."""
        config = config_file(model={"max_tokens": 40}, night={"max_iterations": 1})
        server.enqueue(
            call("edit_file", '{"path": "greet.py", "old": "\'helo\'", "new": ', finish_reason="length", completion_tokens=40),
            *FIX[2:],
        )
        assert overnight("run", "--config", str(config)) == 0
        assert "cut off at the length limit" in user_messages(server.requests[1])

    def test_old_tool_output_is_left_out_of_a_small_window(self, config_file, server, repo, tmp_path):
        """With a 4096-token window, six files read at full cap would fill it: the requests carry the newest
        outputs whole and a line in place of the oldest (overflowed, the server refuses the request); the
        transcript keeps every output."""
        for index in range(6):
            (repo / f"big{index}.py").write_text(f"# file {index}\n" + "x = 1\n" * 600)
        git(repo, "add", ".")
        git(repo, "commit", "-qm", "big files")
        config = config_file(model={"context_window": 4096}, night={"max_iterations": 1, "max_turns": 10})
        server.enqueue(*[call("read_file", {"path": f"big{index}.py"}) for index in range(6)], call("submit", {"summary": "read"}))
        overnight("run", "--config", str(config))
        last = server.requests[-1]["messages"]
        outputs = [m["content"] for m in last if m["role"] == "tool"]
        assert len(outputs) == 6 and "# file 5" in outputs[-1] and "# file 4" in outputs[-2]
        assert outputs[0] == LEFT_OUT
        assert sum(len(text) for text in outputs) <= 4096 * 0.4 * 3 + 2 * 2000
        transcript = "".join(path.read_text() for path in (tmp_path / "state" / "transcripts").iterdir())
        assert all(f"# file {index}" in transcript for index in range(6))

    @pytest.mark.parametrize("served", ["llama.cpp", "vllm"])
    def test_the_window_a_local_server_serves_is_asked_when_nothing_else_knows_it(self, served, config_file, server, repo, capsys):
        """`openai/<anything>` on llama-server or vLLM is a model litellm does not know: the window was unknown,
        nothing was left out, and answers could ask for 2048 tokens of a 4096-token window, until the server
        refused the request (context_overflow). The night asks the server once: llama.cpp's /props, vLLM's
        /v1/models."""
        for index in range(6):
            (repo / f"big{index}.py").write_text(f"# file {index}\n" + "x = 1\n" * 600)
        git(repo, "add", ".")
        git(repo, "commit", "-qm", "big files")
        if served == "llama.cpp":
            server.props = {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1}
        else:
            server.model_fields = {"max_model_len": 4096}
        config = config_file(night={"max_iterations": 1, "max_turns": 10}, tasks=[{"name": "t", "prompt": "p", "check": "true"}])
        server.enqueue(*[call("read_file", {"path": f"big{index}.py"}) for index in range(6)], call("submit", {"summary": "read"}))
        assert overnight("run", "--config", str(config)) == 0
        outputs = [m["content"] for m in server.requests[-1]["messages"] if m["role"] == "tool"]
        assert outputs[0] == LEFT_OUT and "# file 5" in outputs[-1]
        assert {request["max_tokens"] for request in server.requests} == {1024}
        assert server.other_requests[0] == "/props"
        said = [json.loads(line) for line in capsys.readouterr().err.splitlines() if '"context_window_served"' in line]
        assert [(e["window"], e["said_by"].split("'")[0]) for e in said] == [(4096, "llama.cpp" if served == "llama.cpp" else "vLLM")]

    def test_a_window_the_config_gives_is_not_asked_of_the_server(self, config_file, server, repo):
        server.props = {"default_generation_settings": {"n_ctx": 4096}}
        config = config_file(model={"context_window": 8192}, night={"max_iterations": 1}, tasks=[{"name": "t", "prompt": "p", "check": "true"}])
        server.enqueue(call("submit", {"summary": "s"}))
        assert overnight("run", "--config", str(config)) == 0
        assert server.other_requests == [] and server.requests[0]["max_tokens"] == 2048

    def test_a_server_that_says_nothing_of_its_window_leaves_it_unknown(self, config_file, server, repo):
        config = config_file(night={"max_iterations": 1}, tasks=[{"name": "t", "prompt": "p", "check": "true"}])
        server.enqueue(call("submit", {"summary": "s"}))
        assert overnight("run", "--config", str(config)) == 0
        assert server.other_requests == ["/props", "/v1/models"] and server.requests[0]["max_tokens"] == 2048

    def test_a_window_of_309_digits_a_server_reports_is_taken_as_not_reported(self, config_file, server, repo, capsys):
        """A server reporting a window past [model] context_window's ceiling (10**400) leaves it unknown, as one that says
        nothing does: the night works as usual, where the float arithmetic that shares the window out overflowed."""
        server.props = {"default_generation_settings": {"n_ctx": 10**400}}
        config = config_file(night={"max_iterations": 1}, tasks=[{"name": "t", "prompt": "p", "check": "true"}])
        server.enqueue(call("submit", {"summary": "s"}))
        assert overnight("run", "--config", str(config)) == 0
        assert server.other_requests == ["/props", "/v1/models"] and server.requests[0]["max_tokens"] == 2048
        assert '"context_window_served"' not in capsys.readouterr().err

    def test_files_written_long_ago_leave_a_small_window_too(self, config_file, server, repo, tmp_path):
        """Eight files written whole (3000 characters each) filled a 4096-token window with the calls' own
        arguments: the requests carry the oldest calls with their content left out (name and path kept);
        the files, the commit and the transcript have every byte."""
        contents = [f"# file {index}\n" + "".join(f"v{index}_{line} = {line * 7}\n" for line in range(200)) for index in range(8)]
        config = config_file(
            model={"context_window": 4096}, night={"max_iterations": 1, "max_turns": 12},
            tasks=[{"name": "fix-greet", "prompt": "write them", "check": "test -f out7.py"}],
        )
        server.enqueue(*[call("write_file", {"path": f"out{index}.py", "content": contents[index]}) for index in range(8)], call("submit", {"summary": "wrote"}))
        assert overnight("run", "--config", str(config)) == 0
        last = server.requests[-1]["messages"]
        written = [json.loads(c["function"]["arguments"]) for m in last if m["role"] == "assistant" for c in m.get("tool_calls") or ()]
        assert [w["path"] for w in written] == [f"out{index}.py" for index in range(8)]
        assert written[-1]["content"] == contents[-1] and "left out to save room" in written[0]["content"]
        assert git(repo, "show", "overnight/fix-greet:out0.py") + "\n" == contents[0]
        transcript = "".join(path.read_text() for path in (tmp_path / "state" / "transcripts").iterdir())
        assert json.dumps(contents[0])[1:-1] in transcript


class TestTranscripts:
    def test_a_store_started_anew_never_writes_into_an_earlier_nights_transcript(self, config_file, server, repo, capsys):
        """runs.db deleted (the obvious trim of a store that only grows): ids start at 1 again, and the second
        night's first iteration was appended to the first night's transcript of the same name (an outside review)."""
        config = config_file(night={"max_iterations": 1})
        server.enqueue(say(""), say(""))
        assert overnight("run", "--config", str(config)) == 1
        first = Path(report_json(config, capsys)["tasks"][0]["iterations"][0]["transcript"])
        first_lines = first.read_text().splitlines()
        for store_file in (config.parent / "state").glob("runs.db*"):
            store_file.unlink()
        server.enqueue(say(""), say(""))
        assert overnight("run", "--config", str(config)) == 1
        second = Path(report_json(config, capsys)["tasks"][0]["iterations"][0]["transcript"])
        assert second != first and second.name == first.name.replace(".jsonl", ".2.jsonl")
        assert first.read_text().splitlines() == first_lines
        assert json.loads(second.read_text().splitlines()[0])["entry"] == "message"


class TestTheBranchUnderReviewToo:
    """More of the morning's review (a review of the first fix found these)."""

    def _night_then_detach(self, config: Path, server: Any) -> None:
        server.enqueue(*FIX)
        assert overnight("run", "--config", str(config)) == 0
        git(worktree(config), "checkout", "--quiet", "--detach")

    @pytest.mark.parametrize("dirty", [False, True], ids=["clean", "with-an-untracked-file"])
    def test_a_rebase_of_the_branch_stopped_in_the_users_checkout_skips_the_task(self, config_file, server, repo, capsys, dirty):
        """`git worktree list` shows a checkout mid-rebase as detached: the night went on to `checkout` the
        branch (a traceback) or, with a file to clean, onto it (and the person's `rebase --continue` failed)."""
        config = config_file()
        self._night_then_detach(config, server)
        git(repo, "checkout", "--quiet", "-b", "side", "main")
        (repo / "greet.py").write_text("def greet():\n    return 'conflict'\n")
        git(repo, "commit", "--quiet", "-am", "side")
        rebase = subprocess.run(["git", "rebase", "side", "overnight/fix-greet"], cwd=repo, capture_output=True, text=True)
        assert rebase.returncode != 0 and (repo / ".git" / "rebase-merge").exists()
        tip = git(repo, "rev-parse", "overnight/fix-greet")
        if dirty:
            (worktree(config) / "scratch.txt").write_text("a person's\n")
        assert overnight("run", "--config", str(config)) == 1
        [task] = report_json(config, capsys)["tasks"]
        assert (task["outcome"], task["reason"]) == ("skipped", "branch_checked_out")
        assert git(repo, "rev-parse", "overnight/fix-greet") == tip and (repo / ".git" / "rebase-merge").exists()
        assert subprocess.run(["git", "symbolic-ref", "-q", "HEAD"], cwd=worktree(config)).returncode != 0  # still detached

    def test_a_task_worktree_deleted_by_hand_while_its_branch_is_checked_out_is_skipped(self, config_file, server, repo, capsys):
        """rm -rf of the worktree leaves its registration: git's first refusal is "missing but registered",
        its second (after that is forgotten) "already checked out" — the skip, not an exit 2."""
        config = config_file()
        self._night_then_detach(config, server)
        git(repo, "checkout", "--quiet", "overnight/fix-greet")
        shutil.rmtree(worktree(config))
        assert overnight("run", "--config", str(config)) == 1
        [task] = report_json(config, capsys)["tasks"]
        assert (task["outcome"], task["reason"]) == ("skipped", "branch_checked_out")

    def test_commits_made_on_the_detached_head_are_kept_on_a_branch(self, config_file, server, repo):
        """A person committed in the detached task worktree: putting it back on the branch must not leave
        that commit to the reflog alone."""
        config = config_file()
        self._night_then_detach(config, server)
        (worktree(config) / "review.txt").write_text("reviewed\n")
        git(worktree(config), "add", "review.txt")
        git(worktree(config), "commit", "--quiet", "-m", "review on the detached head")
        theirs = git(worktree(config), "rev-parse", "HEAD")
        server.enqueue(call("submit", {"summary": "nothing to do"}))
        assert overnight("run", "--config", str(config)) == 0
        kept = git(repo, "branch", "--list", "overnight-kept/fix-greet/*", "--format=%(refname:short)")
        assert kept and git(repo, "rev-parse", kept) == theirs


class TestSubmodulesToo:
    """A review of the first submodule fix found these."""

    def _with_submodule(self, repo: Path, tmp_path: Path) -> Path:
        library = make_repo(tmp_path / "library", {"lib.py": "x = 1\n"})
        git(library, "commit", "-q", "--allow-empty", "-m", "second")
        git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(library), "vendor/lib")
        git(repo, "commit", "-q", "-m", "vendor lib")
        return library

    def test_files_written_into_a_submodule_never_checked_out_are_no_success(self, config_file, server, repo, tmp_path, capsys):
        """overnight's worktrees do not check submodules out: the folder is empty, and what the agent writes
        there git does not see at all. It was `succeeded` with no commit, the files left for later nights."""
        self._with_submodule(repo, tmp_path)
        config = config_file(tasks=[{"name": "lib", "prompt": "p", "check": "test -f vendor/lib/lib.py"}], night={"max_iterations": 1})
        server.enqueue(call("write_file", {"path": "vendor/lib/lib.py", "content": "x = 2\n"}), call("submit", {"summary": "s"}))
        assert overnight("run", "--config", str(config)) == 1
        [task] = report_json(config, capsys)["tasks"]
        assert (task["outcome"], task["reason"]) == ("failed", "iteration_error")
        assert list((worktree(config, "lib") / "vendor" / "lib").iterdir()) == []

    def test_a_rolled_back_iteration_puts_a_submodule_back_on_its_recorded_commit(self, config_file, server, repo, tmp_path, capsys):
        """The agent checked the submodule out at another commit, and its iteration was rolled back: the
        next iteration's commit carried the moved submodule with it."""
        self._with_submodule(repo, tmp_path)
        recorded = git(repo, "rev-parse", "HEAD:vendor/lib")
        config = config_file(
            tasks=[{"name": "lib", "prompt": "p", "check": "test -f done.txt", "tools": ["run_command", "write_file", "submit"]}],
            night={"max_iterations": 2},
        )
        from orchestrator.worktree import Worktree

        tree = Worktree.ensure(repo, config.parent / "state", "lib", "HEAD")
        git(tree.path, "-c", "protocol.file.allow=always", "submodule", "update", "-q", "--init")
        server.enqueue(
            call("run_command", {"command": "git -C vendor/lib checkout -q HEAD~1"}), call("submit", {"summary": "not yet"}),
            call("write_file", {"path": "done.txt", "content": "done\n"}), call("submit", {"summary": "done"}),
        )
        assert overnight("run", "--config", str(config)) == 0
        assert git(repo, "rev-parse", "overnight/lib:vendor/lib") == recorded
