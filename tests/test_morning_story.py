"""The morning's artifacts tell one story: report (text and --json), notes.md, JUnit, the step
summary, the JSON log lines and the git branches agree with each other and with the repository.

Real nights of mixed outcomes through `overnight run` subprocesses against the scripted server;
after each night every artifact is read back and checked against the others (`assert_one_story`).
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from orchestrator.build import open_store
from orchestrator.config import load_config
from orchestrator.notes import NotesBook
from orchestrator.report import counted
from orchestrator.scripted import Reply, call
from tests.conftest import SAMPLE_FILES, git, make_repo, write_config

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "greet() should return 'hello'."
CHECK = "python check_greet.py"
FIX = [call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}), call("submit", {"summary": "fixed"})]
REPEAT = [call("read_file", {"path": "greet.py"})] * 4  # the repeated-call guard's stop (repeat_stop_at 4)
CHECK_FAILS = [call("run_check", {}), call("submit", {"summary": "done, I think"})]
NO_SUBMIT = [call("run_check", {}), call("read_file", {"path": "greet.py"}), call("list_dir", {"path": "."}), call("read_file", {"path": "check_greet.py"})]
EDIT_THEN_WAIT = [call("write_file", {"path": "scratch.txt", "content": "half-done"}), Reply(text="thinking", delay_s=30)]
FIRE = "2026-12-01T01:00:00+00:00"
# Which log event ends an iteration of each outcome (a rolled-back one whose model was unreachable has its own).
ENDING_EVENTS = {"committed": "iteration_committed", "rolled_back": "iteration_rolled_back", "cancelled": "iteration_cancelled"}
BADGE_LEVELS = {"⚠": "warning", "✖": "severe"}
JUNIT_VERDICTS = {"succeeded": None, "failed": "failure", "parked": "failure", "paused": "error", "cancelled": "skipped", "skipped": "skipped"}


class Night:
    """One `overnight run` subprocess with --junit, $GITHUB_STEP_SUMMARY and JSON logs, in `folder`."""

    def __init__(self, folder: Path, config: Path, *args: str) -> None:
        self.folder, self.config = folder, config
        self.junit = folder / f"junit-{len(list(folder.glob('junit-*.xml')))}.xml"
        self.summary = folder / "summary.md"
        command = [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--junit", str(self.junit), "--log-format", "json", *args]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "GITHUB_STEP_SUMMARY": str(self.summary), "PYTHONDONTWRITEBYTECODE": "1"}
        self.process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.notes_before = len(notes_of(config))

    def wait(self) -> "Night":
        _, self.stderr = self.process.communicate(timeout=120)
        self.rc = self.process.returncode
        return self

    def signal_once_written(self, task: str, signum: int) -> "Night":
        """Sent `signum` once `task`'s agent wrote scratch.txt (EDIT_THEN_WAIT)."""
        scratch = self.config.parent / "state" / "worktrees" / task / "scratch.txt"
        deadline = time.monotonic() + 60
        while not scratch.exists() and time.monotonic() < deadline and self.process.poll() is None:
            time.sleep(0.02)
        assert scratch.exists(), self.process.communicate()[1]
        self.process.send_signal(signum)
        return self.wait()

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stderr.splitlines() if line.startswith("{")]


def cli(config: Path, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args, "--config", str(config)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def notes_of(config: Path) -> list[Any]:
    return NotesBook(config.parent / "state" / "notes.md").entries()


def config_for(folder: Path, server: Any, names: list[str], **sections: Any) -> tuple[Path, Path]:
    repo = make_repo(folder / "repo", SAMPLE_FILES)
    tasks = [{"name": name, "prompt": PROMPT, "check": CHECK} for name in names]
    return write_config(folder / "overnight.toml", api_base=server.url, repo=repo, tasks=tasks, **sections), repo


def check_passes_at(repo: Path, commit: str, into: Path) -> bool:
    """The task's check, run on a clean copy of `commit`'s tree."""
    archive = subprocess.run(["git", "archive", commit], cwd=repo, capture_output=True, check=True).stdout
    into.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tree:
        tree.extractall(into, filter="data")
    return subprocess.run([sys.executable, "check_greet.py"], cwd=into, capture_output=True).returncode == 0


def summary_rows(summary: str, run_id: int) -> tuple[str, dict[str, list[str]]]:
    """The step summary's heading for `run_id` and its rows by task: each row's cells."""
    section = summary.split(f"## overnight run #{run_id}:")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith(("| task ", "| ---"))]
    cells = [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows]
    return section.splitlines()[0], {row[0]: row for row in cells}


def expected_notes(task: dict[str, Any]) -> list[tuple[str, int, str]]:
    """The notes.md entries a task's iterations owe: one per iteration stopped by a guard, the check or
    a cancel (an unreachable model and a killed night leave none), one more when the task was parked."""
    owed = [
        (task["name"], it["number"], it["reason"])
        for it in task["iterations"]
        if it["outcome"] == "cancelled" or (it["outcome"] == "rolled_back" and it["reason"] != "model_unreachable")
    ]
    if task["outcome"] == "parked" and task["iterations"]:
        owed.append((task["name"], task["iterations"][-1]["number"], "parked"))
    return owed


def assert_one_story(night: Night, repo: Path) -> dict[str, Any]:
    """Every artifact of `night` against the report's JSON, and that against the repository; the JSON."""
    report = json.loads(cli(night.config, "report", "--json"))
    text = cli(night.config, "report").splitlines()
    run, tasks = report["run"], report["tasks"]
    assert run["exit_code"] == night.rc, night.stderr
    events = [e for e in night.events() if e.get("run_id") == run["id"]]
    [ended] = [e for e in events if e["event"] in ("night_finished", "night_cancelled")]
    assert ended["exit_code"] == night.rc
    assert (ended["event"] == "night_cancelled") == (run["status"] == "cancelled")

    suite = ET.parse(night.junit).getroot().find("testsuite")
    properties = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert (properties["run_id"], properties["status"], properties["exit_code"]) == (str(run["id"]), run["status"], str(night.rc))
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    assert list(cases) == [task["name"] for task in tasks]

    heading, rows = summary_rows(night.summary.read_text(), run["id"])
    # The heading counts a task an earlier run of the fire committed (done_earlier_tonight), as the exit code does.
    succeeded = sum(task["outcome"] == "succeeded" or task["reason"] == "done_earlier_tonight" for task in tasks)
    assert heading.startswith(f" {succeeded}/{len(tasks)} task(s) succeeded ({run['status']}, exit {night.rc})")
    # The text report's second line: the same count, the line a reader looks for first; a paused task said to be paused.
    assert text[1].startswith(f"{succeeded} of {len(tasks)} task(s) succeeded"), text[1]
    assert (" paused (the model server could not be reached" in text[1]) == any(t["outcome"] == "paused" for t in tasks), text[1]
    assert list(rows) == [task["name"] for task in tasks]

    notes_written = [(n.task, n.iteration, n.reason) for n in notes_of(night.config)[night.notes_before:]]
    assert all(entry.text.split("**Correction:**")[1].strip() for entry in notes_of(night.config))
    assert notes_written == [owed for task in tasks for owed in expected_notes(task)]

    for task in tasks:
        name, outcome, reason, iterations = task["name"], task["outcome"], task["reason"], task["iterations"]
        # The text report: the task's line, then one line per iteration with its outcome, reason, turns and tokens.
        [at] = [i for i, line in enumerate(text) if line.split(" ", 1)[-1].startswith(f"{name}: {outcome}")]
        head = text[at]
        if reason == "parked" and iterations:  # which stop parked it, not "parked (parked)"
            assert f"(parked: {iterations[-1]['reason']} stopped " in head, head
        elif outcome == "paused":  # which endpoint failed and how, and that it is worked again
            assert head.startswith(f"↻ {name}: paused ({reason}: model endpoint http://127.0.0.1:") and "; retried next night)" in head, head
        else:
            assert (f"({reason})" in head) == bool(reason and outcome != "succeeded"), head
        if iterations or reason not in ("done_earlier_tonight", "failed_earlier_tonight", "parked_earlier_tonight"):
            assert f" · {counted(len(iterations), 'iteration')}" in head, head
        if task["commit"]:
            assert f"@ {task['commit'][:10]}" in head
        for line, it in zip(text[at + 1:], iterations, strict=False):
            assert line.startswith(f"    #{it['number']} {it['outcome']}"), line
            assert f" · {counted(it['turns'], 'turn')} · {counted(it['tokens'], 'token')}" in line, line
            if it["reason"] and it["reason"] != it["outcome"]:
                assert line.startswith(f"    #{it['number']} {it['outcome']} {it['reason']} · "), line
        # What the morning is told to review: the work on the branch, done tonight.
        review = f"  git diff main...{task['branch']}"
        assert (review in text) == (outcome == "succeeded" or (reason == "done_earlier_tonight" and bool(task["commit"]))), name

        # The log: one task_finished, and each iteration's ending with the same turns and tokens.
        [finished] = [e for e in events if e["event"] == "task_finished" and e["task"] == name]
        assert (finished["outcome"], finished["reason"], finished["iterations"]) == (outcome, reason, len(iterations))
        for it in iterations:
            event = "iteration_model_unreachable" if it["reason"] == "model_unreachable" else ENDING_EVENTS[it["outcome"]]
            [ending] = [e for e in events if e["event"] == event and e.get("task") == name and e.get("iteration") == it["number"]]
            assert (ending.get("turns"), ending.get("tokens")) == (it["turns"], it["tokens"]), (name, ending)
            if it["outcome"] == "rolled_back" and event == "iteration_rolled_back":
                assert ending["reason"] == it["reason"]

        # JUnit: the verdict the outcome calls for, the same reason codes, the same commit.
        case, verdict = cases[name], JUNIT_VERDICTS[outcome]
        assert [child.tag for child in case if child.tag != "system-out"] == ([verdict] if verdict else [])
        codes = list(dict.fromkeys(it["reason"] for it in iterations if it["reason"]))
        if verdict == "failure":
            assert case.find("failure").get("message") == (", ".join(codes) or reason)
        elif verdict == "error":
            assert case.find("error").get("type") == reason
        elif verdict == "skipped":
            assert case.find("skipped").get("message") == ("cancelled" if outcome == "cancelled" else reason)
        assert f"commit: {task['commit'] or '(none)'}" in case.find("system-out").text

        # The step summary's row.
        row = rows[name]
        assert row[1].endswith(outcome) and row[3] == str(len(iterations))
        # A paused task's reason with its endpoint and error, as the text report's head gives them; any other's code alone.
        if outcome == "paused":
            assert row[2].startswith(f"`{reason}`: model endpoint http://127.0.0.1:"), row[2]
        else:
            assert row[2] == (f"`{reason}`" if reason else ""), row[2]
        assert row[5] == f"`{task['branch']}`" + (f" @ `{task['commit'][:10]}`" if task["commit"] else "")
        # Its worst signal is the text report's badge's (a succeeded task's from its committed iteration alone).
        badge = re.search(r" · ([⚠✖]) ([a-z_]+): ", head)
        assert row[4].startswith(f"{BADGE_LEVELS[badge[1]]} `{badge[2]}`: ") if badge else row[4] == "", (head, row[4])

        # The repository: a commit shown is the branch's tip and passes the check; nothing left uncommitted.
        if task["commit"]:
            assert git(repo, "rev-parse", task["branch"]) == task["commit"]
            assert check_passes_at(repo, task["commit"], night.folder / f"tree-{run['id']}-{name}")
        worktree = night.config.parent / "state" / "worktrees" / name
        if worktree.exists():
            assert git(worktree, "status", "--porcelain") == "", name
    return report


class TestOneStory:
    def test_a_night_of_mixed_outcomes(self, tmp_path, server):
        """A commit, a guard's stop (parked), a failed check then max_turns (failed), a server answering
        500 (paused), the night's token budget spent by one task (cancelled) and so not begun by the next."""
        config, repo = config_for(
            tmp_path, server, ["commit", "guard", "turns", "down", "budget", "after"],
            night={"max_iterations": 2, "max_turns": 4, "concurrency": 1, "max_tokens_per_night": 500_000}, guards={"park_after": 2},
        )
        server.enqueue(*FIX, *REPEAT, *REPEAT, *CHECK_FAILS, *NO_SUBMIT, Reply(status=500), Reply(status=500),
                       call("list_dir", {"path": "."}, prompt_tokens=600_000), call("read_file", {"path": "greet.py"}))
        night = Night(tmp_path, config).wait()
        assert night.rc == 3, night.stderr
        report = assert_one_story(night, repo)
        assert [(t["name"], t["outcome"]) for t in report["tasks"]] == [
            ("commit", "succeeded"), ("guard", "parked"), ("turns", "failed"), ("down", "paused"), ("budget", "cancelled"), ("after", "cancelled"),
        ]
        # notes.md's opening promises no entry for the paused task's iteration, which rolled back and left none.
        opening = (tmp_path / "state" / "notes.md").read_text().split("\n## ")[0]
        assert "none when the model server could not be reached" in opening, opening
        turns = ET.parse(night.junit).getroot().find(".//testcase[@name='turns']/failure")
        assert (turns.get("message"), turns.get("type")) == ("check_failed, max_turns", "max_turns")
        assert server.exhausted == 0

    def test_a_scheduled_night_cancelled_by_sigterm_then_begun_again(self, tmp_path, server):
        """The first run of a fire commits one task and is stopped by SIGTERM in the other's second iteration;
        the run begun again skips the done task (its work still offered for review) and numbers on."""
        config, repo = config_for(
            tmp_path, server, ["commit", "guard"],
            night={"max_iterations": 2, "max_turns": 4, "concurrency": 1}, guards={"park_after": 2}, model={"request_timeout_s": 60},
        )
        server.enqueue(*FIX, *REPEAT, *EDIT_THEN_WAIT)
        first = Night(tmp_path, config, "--scheduled-for", FIRE).signal_once_written("guard", signal.SIGTERM)
        assert first.rc == 143, first.stderr
        earlier = assert_one_story(first, repo)
        [guard] = [t for t in earlier["tasks"] if t["name"] == "guard"]
        assert [(it["outcome"], it["reason"]) for it in guard["iterations"]] == [("rolled_back", "repeated_tool_call"), ("cancelled", "cancelled")]
        assert not [s for s in guard["iterations"][1]["signals"] if s["level"] == "severe"]  # cancelled: no struggle

        server.enqueue(*REPEAT)
        again = Night(tmp_path, config, "--scheduled-for", FIRE).wait()
        assert again.rc == 1, again.stderr
        report = assert_one_story(again, repo)
        assert [(t["name"], t["outcome"], t["reason"]) for t in report["tasks"]] == [
            ("commit", "skipped", "done_earlier_tonight"), ("guard", "parked", "parked"),
        ]
        assert report["tasks"][0]["commit"] == earlier["tasks"][0]["commit"]
        assert [it["number"] for it in report["tasks"][1]["iterations"]] == [3]
        # The fire's two runs add up: what the second says it went on from is what the first spent.
        [resumed] = [e for e in again.events() if e["event"] == "night_resumed"]
        assert resumed["tokens"] == sum(it["tokens"] for t in earlier["tasks"] for it in t["iterations"])
        assert resumed["done"] == 1
        assert [(n.task, n.iteration, n.reason) for n in notes_of(config)] == [
            ("guard", 1, "repeated_tool_call"), ("guard", 2, "cancelled"), ("guard", 3, "repeated_tool_call"), ("guard", 3, "parked"),
        ]

    def test_a_killed_night_is_recovered_as_interrupted(self, tmp_path, server):
        """kill -9 mid-iteration: the next night rolls the iteration back and records it interrupted, with no
        note and no blame; that night's own artifacts agree, and the killed run reads crashed."""
        config, repo = config_for(tmp_path, server, ["slow"], night={"max_iterations": 2, "max_turns": 4}, model={"request_timeout_s": 60})
        server.enqueue(*EDIT_THEN_WAIT)
        killed = Night(tmp_path, config).signal_once_written("slow", signal.SIGKILL)
        assert killed.rc == -signal.SIGKILL
        server.enqueue(*FIX)
        after = Night(tmp_path, config).wait()
        assert after.rc == 0, after.stderr
        report = assert_one_story(after, repo)
        assert report["run"]["id"] == 2 and [t["outcome"] for t in report["tasks"]] == ["succeeded"]
        store = open_store(load_config(config), reading=True)
        try:
            dead = store.run(1)
        finally:
            store.close()
        assert dead.status == "crashed"
        [task] = dead.tasks
        assert (task.outcome, task.reason) == ("failed", "interrupted")
        assert [(it.outcome, it.reason, [s for s in it.signals if s.level.value == "severe"]) for it in task.iterations] == [("interrupted", "interrupted", [])]
        assert [(n.task, n.iteration) for n in notes_of(config)] == []  # interrupted: no note
        assert [e["event"] for e in after.events() if e.get("run_id") == 1 and e["event"] == "iteration_recovered"] == ["iteration_recovered"]
