"""The night's log as a person and a log pipeline read it."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import pytest
import structlog

from orchestrator import logs
from orchestrator.config import load_config
from orchestrator.fake_server import ScriptedServer
from orchestrator.leases import new_owner
from orchestrator.lock import state_identity
from orchestrator.scripted import call
from runs import RunStore
from tests.conftest import SAMPLE_FILES, git, make_repo, write_config
from tests.test_faults import dead_pid
from tests.test_night import FIX


@pytest.fixture(autouse=True)
def _logging_restored():
    saved, modes = structlog.get_config(), (logs._json_mode, logs._json_asked)
    yield
    structlog.configure(**saved)
    logs._json_mode, logs._json_asked = modes


@contextlib.contextmanager
def json_logs() -> Iterator[io.StringIO]:
    """The log of what runs in this process, as JSON lines in a buffer; the logging as it was after."""
    saved, modes = structlog.get_config(), (logs._json_mode, logs._json_asked)
    out = io.StringIO()
    logs.configure_logging("json", stream=out)
    try:
        yield out
    finally:
        structlog.configure(**saved)
        logs._json_mode, logs._json_asked = modes


def events_of(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def _log_an_error(log_format: str) -> str:
    out = io.StringIO()
    logs.configure_logging(log_format, stream=out)

    def call_model(api_key: str) -> None:
        raise ValueError("Port out of range 0-65535")

    key = "-".join(("sk", "SECRET123"))  # not spelled whole in a source line the traceback shows
    try:
        call_model(api_key=key)
    except ValueError:
        logs.get_logger(run_id=7).exception("iteration_error")
    return out.getvalue()


@pytest.mark.parametrize("log_format", ["human", "json"])
def test_an_error_is_logged_with_its_traceback_but_not_the_variables_around_it(log_format):
    """A traceback's local variables hold the api_key; a log someone pastes into an issue must not."""
    text = _log_an_error(log_format)
    assert "iteration_error" in text and "ValueError: Port out of range" in text and "call_model" in text
    assert "sk-SECRET123" not in text


def test_json_lines_carry_the_event_name_and_the_ids_bound():
    event = json.loads(_log_an_error("json").splitlines()[0])
    assert event["event"] == "iteration_error" and event["run_id"] == 7 and event["level"] == "error"


def test_a_python_warning_in_json_mode_is_a_json_line_too():
    """A library's warning (or one PYTHONWARNINGS shows) was Python's two plain lines among the JSON ones."""
    import warnings

    with json_logs() as out, warnings.catch_warnings():
        logs.configure_logging("json", stream=out)
        warnings.simplefilter("always")
        warnings.warn("this API goes away\nnext release", FutureWarning, stacklevel=1)
    [event] = events_of(out)
    assert (event["event"], event["level"], event["category"]) == ("python_warning", "warning", "FutureWarning")
    assert event["message"] == "this API goes away\nnext release" and event["where"].startswith(__file__)


class _CollectedMidWrite(io.StringIO):
    """A log stream in whose first write the garbage collector runs, as it may at any allocation, and finds a file left
    open in a reference cycle (as litellm's cached clients are cycles holding sockets)."""

    def write(self, text: str) -> int:
        if not hasattr(self, "collected"):
            self.collected = True
            cycle: dict[str, Any] = {"file": open(__file__, "rb")}
            cycle["self"] = cycle
            del cycle
            gc.collect()
        return super().write(text)


def test_a_warning_shown_while_a_json_line_is_written_is_the_line_after_it_not_a_hang():
    """The ResourceWarning of a collection in the middle of a write was logged there, inside the write's lock, which is
    not reentrant: the thread waited on itself and the night hung."""
    import warnings

    out = _CollectedMidWrite()
    with warnings.catch_warnings():
        logs.configure_logging("json", stream=out)
        warnings.simplefilter("always", ResourceWarning)
        writer = threading.Thread(target=lambda: logs.get_logger().info("first_line"), daemon=True)
        writer.start()
        writer.join(10)
    assert not writer.is_alive(), "the log call never returned"
    assert [event["event"] for event in events_of(out)] == ["first_line", "python_warning"]


# --- Events of a real night (`overnight run --log-format json`, a subprocess as CI runs it) -------------

TWO_TASKS = [
    {"name": "fix-greet", "prompt": "greet() should return 'hello'.", "check": "python check_greet.py"},
    {"name": "held", "prompt": "p", "check": "true"},
]
OTHER_MACHINE = f"machine-b:1:cafe:{'b' * 32}"
SECRET_NAME = "OVERNIGHT_TEST_API_TOKEN"


class Night(NamedTuple):
    folder: Path
    exit_code: int
    events: list[dict[str, Any]]


def _json_run(config: Path, env: dict[str, str] | None = None, *, args: tuple[str, ...] = ()) -> Night:
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--log-format", "json", *args],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120, env={**os.environ, "NO_COLOR": "1", **(env or {})},
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert all(line.startswith("{") for line in lines), done.stderr
    return Night(config.parent, done.returncode, [json.loads(line) for line in lines])


def _leave_debris_of_earlier_nights(config: Path) -> None:
    """What nights and people leave in a state dir between two nights, each of which the next night's
    start settles with a log event of its own."""
    settings = load_config(config)
    state, worktree = settings.state_dir, settings.state_dir / "worktrees" / "fix-greet"
    # A person's commit on the task worktree's detached HEAD (worktree_commits_kept).
    git(worktree, "checkout", "-q", "--detach")
    (worktree / "review.txt").write_text("a reviewer's note\n")
    git(worktree, "add", "review.txt")
    git(worktree, "commit", "-q", "-m", "a reviewer's commit")
    # A killed git's index.lock (git_lock_removed), a half-written notes.md (temp_file_removed).
    gitdir = Path(git(worktree, "rev-parse", "--absolute-git-dir").strip())
    (gitdir / "index.lock").write_text("")
    (state / ".notes.md.123.tmp").write_text("half")
    # Last month's transcripts (transcripts_removed).
    for old in settings.transcripts_dir.glob("*.jsonl"):
        os.utime(old, (time.time() - 40 * 86400,) * 2)
    store = RunStore.open(settings.store_url)
    try:
        # A run whose process died (run_recovered); a lease of this state dir's dead process
        # (lease_released); a lease another machine holds (task_skipped_leased).
        store.begin_run(config_path=str(config), pid=dead_pid(), host=socket.gethostname(), state_id=state_identity(state))
        dead = new_owner(state_identity(state)).replace(f":{os.getpid()}:", f":{dead_pid()}:")
        assert store.acquire_lease("gone", dead, ttl_s=600)
        assert store.acquire_lease("held", OTHER_MACHINE, ttl_s=600)
    finally:
        store.close()


@pytest.fixture(scope="module")
def second_night(tmp_path_factory: pytest.TempPathFactory) -> Night:
    """A night that commits, then one that finds what the first left and people added since, and no
    model at all: a closed port."""
    folder = tmp_path_factory.mktemp("nights")
    repo = make_repo(folder / "repo", SAMPLE_FILES)
    with ScriptedServer(list(FIX)) as server:
        config = write_config(folder / "overnight.toml", api_base=server.url, repo=repo, tasks=TWO_TASKS[:1])
        first = _json_run(config)
    assert first.exit_code == 0, first.events
    _leave_debris_of_earlier_nights(config)
    config = write_config(
        folder / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, tasks=TWO_TASKS, state={"keep_transcripts_days": 7}
    )
    return _json_run(config, env={SECRET_NAME: "s3cr3t-value-not-a-word"})


def _one(events: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [e for e in events if e["event"] == name]
    assert len(found) == 1, (name, [e["event"] for e in events])
    return found[0]


def _run_id_of_the_night(events: list[dict[str, Any]]) -> int:
    return _one(events, "night_started")["run_id"]


class TestEventsBeforeTheNight:
    """What the next night's start settles, each under its name in reference.md with its fields. These come
    before the night's run exists: they carry no run_id (the dead run's, for run_recovered)."""

    def test_a_dead_nights_run_is_recovered(self, second_night):
        events = second_night.events
        recovered = _one(events, "run_recovered")
        assert recovered["run_id"] != _run_id_of_the_night(events) and isinstance(recovered["dead_pid"], int) and recovered["dead_host"]

    def test_a_dead_processes_lease_is_released(self, second_night):
        folder, events = second_night.folder, second_night.events
        released = _one(events, "lease_released")
        assert released["task"] == "gone" and released["dead_owner"].endswith(":" + state_identity(folder / "state"))
        assert "run_id" not in released

    def test_a_killed_gits_lock_is_removed(self, second_night):
        events = second_night.events
        removed = _one(events, "git_lock_removed")
        assert removed["task"] == "fix-greet" and removed["path"].endswith("index.lock")

    def test_a_half_written_temporary_file_is_removed(self, second_night):
        folder, events = second_night.folder, second_night.events
        assert _one(events, "temp_file_removed")["path"] == str(folder / "state" / ".notes.md.123.tmp")

    def test_old_transcripts_are_removed(self, second_night):
        """`[state] keep_transcripts_days`: the first night's transcript, made 40 days old, goes."""
        events = second_night.events
        removed = _one(events, "transcripts_removed")
        assert (removed["count"], removed["older_than_days"]) == (1, 7) and "run_id" not in removed


class TestEventsOfTheNight:
    def test_the_secrets_withheld_are_named_not_shown(self, second_night):
        events = second_night.events
        withheld = _one(events, "secrets_withheld")
        assert SECRET_NAME in withheld["names"] and withheld["run_id"] == _run_id_of_the_night(events)
        assert "s3cr3t-value-not-a-word" not in json.dumps(events)

    def test_a_persons_commits_on_the_detached_worktree_are_kept(self, second_night):
        """Logged while the night's run exists (the worktree is made for its task): with its run_id and the task's task_run_id too."""
        folder, events = second_night.folder, second_night.events
        kept = _one(events, "worktree_commits_kept")
        assert kept["task"] == "fix-greet" and kept["branch"].startswith("overnight-kept/fix-greet/")
        assert kept["run_id"] == _run_id_of_the_night(events)
        [finished] = [e for e in events if e["event"] == "task_finished" and e["task"] == "fix-greet"]
        assert kept["task_run_id"] == finished["task_run_id"]
        assert git(folder / "repo", "log", "-1", "--format=%s", kept["branch"]).strip() == "a reviewer's commit"

    def test_a_task_another_worker_holds_is_skipped(self, second_night):
        events = second_night.events
        skipped = _one(events, "task_skipped_leased")
        assert skipped["task"] == "held" and OTHER_MACHINE in skipped["holder"]
        assert skipped["run_id"] == _run_id_of_the_night(events) and isinstance(skipped["task_run_id"], int)
        finished = [e for e in events if e["event"] == "task_finished" and e["task"] == "held"]
        assert [(e["outcome"], e["reason"], e["iterations"]) for e in finished] == [("skipped", "leased", 0)]

    def test_an_unreachable_model_pauses_the_task_and_ends_the_night_with_3(self, second_night):
        events = second_night.events
        assert second_night.exit_code == 3
        unreachable = _one(events, "iteration_model_unreachable")
        assert unreachable["task"] == "fix-greet" and "127.0.0.1:9" in unreachable["detail"]
        assert unreachable["run_id"] == _run_id_of_the_night(events) and isinstance(unreachable["task_run_id"], int)
        assert (unreachable["iteration"], isinstance(unreachable["iteration_id"], int)) == (1, True)
        finished = [e for e in events if e["event"] == "task_finished" and e["task"] == "fix-greet"]
        assert [(e["outcome"], e["reason"], e["iterations"]) for e in finished] == [("paused", "model_unreachable", 1)]
        night = _one(events, "night_finished")
        assert (night["exit_code"], night["succeeded"], night["stopped_early"]) == (3, 0, None)


class TestCommittedEvent:
    def test_an_iteration_that_made_no_commit_logs_commit_null_as_the_report_says_it(self, tmp_path, capsys):
        """The check passed on the checkpoint as it was: `iteration_committed` has `commit` null, as `report --json` does, not ""."""
        from tests.test_night import report_json

        repo = make_repo(tmp_path / "repo", SAMPLE_FILES)
        tasks = [{"name": "already-done", "prompt": "p", "check": "true"}]
        with ScriptedServer([call("submit", {"summary": "nothing to change"})]) as server:
            config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=tasks)
            night = _json_run(config)
        assert night.exit_code == 0, night.events
        committed = _one(night.events, "iteration_committed")
        [task] = report_json(config, capsys)["tasks"]
        assert task["iterations"][0]["commit"] is None and committed["commit"] is None


class TestHumanLines:
    def test_a_folder_the_models_code_named_is_shown_escaped_on_the_next_nights_terminal(self, config_file, server):
        """The model's code, run by the check, makes a folder in the state dir's worktrees named to clear the screen and
        hide what follows; the next night's `worktree_folder_kept` line on a terminal shows the name escaped."""
        makes_folder = (
            "import os\nos.makedirs(os.path.join('..', 'y\\x1b[2J\\x1b[8m'), exist_ok=True)\n"
            "open(os.path.join('..', 'y\\x1b[2J\\x1b[8m', 'f'), 'w').close()\ndef greet():\n    return 'helo'\n"
        )
        config = config_file(night={"max_iterations": 1})
        server.enqueue(call("write_file", {"path": "greet.py", "content": makes_folder}), call("submit", {"summary": "done"}))
        assert _json_run(config).exit_code == 1
        server.enqueue(call("submit", {"summary": "done"}))
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(config), "--log-format", "human"],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120, env={**os.environ, "NO_COLOR": "1"},
        )
        [kept] = [line for line in done.stderr.splitlines() if "worktree_folder_kept" in line]
        assert "task=y\\x1b[2J\\x1b[8m " in kept and kept.isprintable(), kept

    def test_a_value_of_several_lines_reads_with_one_backslash_at_each_line_break(self):
        """A git error of two lines reads as its repr, as before any escaping of ours, and a screen clear beside a space
        as its escape: each escaped once, never with its backslash doubled."""
        error, name = "Cmd('git') failed\n  stderr: 'fatal: bad'", "y \x1b[2J"
        out = io.StringIO()
        logs.configure_logging("human", stream=out)
        logs.get_logger().warning("tool_error", error=error, name=name)
        line = out.getvalue()
        assert f"error={error!r} name={name!r}" in line, line


class TestDeadlineEvents:
    def test_the_deadline_cancels_the_iteration_and_says_so(self, config_file, server):
        """At `[night] deadline` the iteration in flight is `iteration_cancelled` (`why`: deadline), each task's
        `task_finished` says `cancelled`/`deadline` (the one that never began too), and `night_finished` says what
        stopped it early. In this process, on a clock two seconds before the deadline."""
        from datetime import datetime, timezone

        from tests.test_unattended import EDIT_THEN_WAIT, clock_from, run_in_process

        config = config_file(tasks=TWO_TASKS, model={"request_timeout_s": 60}, night={"deadline": "06:30"})
        server.enqueue(*EDIT_THEN_WAIT)
        with json_logs() as out:
            result = run_in_process(config, now=clock_from(datetime(2026, 11, 30, 6, 29, 58, tzinfo=timezone.utc)))
        assert result.exit_code == 1
        events = events_of(out)
        run_id = _run_id_of_the_night(events)
        cancelled = _one(events, "iteration_cancelled")
        assert (cancelled["why"], cancelled["task"], cancelled["iteration"], cancelled["run_id"]) == ("deadline", "fix-greet", 1, run_id)
        assert isinstance(cancelled["task_run_id"], int) and isinstance(cancelled["iteration_id"], int)
        finished = [(e["task"], e["outcome"], e["reason"], e["iterations"]) for e in events if e["event"] == "task_finished"]
        assert finished == [("fix-greet", "cancelled", "deadline", 1), ("held", "cancelled", "deadline", 0)]
        night = _one(events, "night_finished")
        assert (night["exit_code"], night["stopped_early"], night["run_id"]) == (1, "deadline", run_id)
        assert "night_cancelled" not in [e["event"] for e in events]  # that one is a signal's: exit 130/143/129

    def test_a_night_the_deadline_ends_before_it_comes_says_so(self, config_file, server):
        """No iteration that cannot finish by the deadline starts: a night whose tasks that refused ends
        before 06:30 itself, and was still stopped early by the deadline (`stopped_early`: deadline)."""
        from datetime import datetime, timezone

        from tests.test_unattended import clock_from, run_in_process

        config = config_file(night={"deadline": "06:30", "max_iterations": 3})
        server.enqueue(call("read_file", {"path": "greet.py"}, delay_s=1.5), call("submit", {"summary": "x"}))
        # The clock runs 20x fast: the ~2 s first iteration looks like ~40 s, more than the ~20 s then left.
        with json_logs() as out:
            result = run_in_process(config, now=clock_from(datetime(2026, 11, 30, 6, 29, 0, tzinfo=timezone.utc), speed=20))
        [task] = result.tasks
        assert (len(task.iterations), task.outcome.value, task.reason) == (1, "cancelled", "deadline")
        night = _one(events_of(out), "night_finished")
        assert (night["exit_code"], night["stopped_early"]) == (1, "deadline")

    @pytest.mark.parametrize(
        ("deadline", "started", "zone", "chosen"),
        [
            ("06:30", "2026-11-30T01:30:00+00:00", "UTC", "2026-11-30T06:30:00+00:00"),  # the same morning's
            ("06:30", "2026-11-30T07:00:00+00:00", "UTC", "2026-12-01T06:30:00+00:00"),  # a run by hand past it: tomorrow's
            (None, "2026-11-30T01:30:00+00:00", "UTC", None),
            # The clocks go back at 03:00: 02:30's first pass (+02:00) has gone by, the second (+01:00) is ahead.
            ("02:30", "2026-10-25T00:45:00+00:00", "Europe/Paris", "2026-10-25T02:30:00+01:00"),
            # The clocks go forward at 02:00: 02:30 never shows; the instant it names shows as 03:30, not 02:30+01:00.
            ("02:30", "2026-03-28T23:00:00+00:00", "Europe/Paris", "2026-03-29T03:30:00+02:00"),
        ],
        ids=["same-morning", "tomorrows", "none", "clocks-back", "clocks-forward"],
    )
    def test_night_started_names_the_deadline_the_night_works_to(self, config_file, server, deadline, started, zone, chosen):
        """A run by hand, or a cron run later than its deadline's time, works to tomorrow's deadline, and no line
        said which: `night_started`'s `deadline` is the instant chosen (ISO 8601, on the schedule's clock), null
        without one."""
        from datetime import datetime

        from tests.test_unattended import clock_from, run_in_process

        night = {"deadline": deadline, "max_iterations": 1} if deadline else {"max_iterations": 1}
        config = config_file(night=night, extra=f'\n[schedule]\ntimezone = "{zone}"\n')
        server.enqueue(*FIX)
        with json_logs() as out:
            run_in_process(config, now=clock_from(datetime.fromisoformat(started)))
        assert _one(events_of(out), "night_started")["deadline"] == chosen

    def test_an_answer_the_deadline_cuts_off_mid_stream_counts_the_tokens_it_used(self, config_file, server, capsys):
        """The deadline came while an answer streamed: its thousands of tokens went uncounted (the cancelled iteration
        said 0), where one cut off as runaway output or silence counts what it used. The iteration's log and its
        row in the store now count them, and so the night's total and a night begun again."""
        from datetime import datetime, timezone

        from tests.test_night import report_json
        from tests.test_unattended import clock_from, run_in_process

        config = config_file(model={"request_timeout_s": 60, "max_tokens": 100000}, night={"deadline": "06:30"})
        thinking = " ".join(f"step{n * 7919 % 10007}" for n in range(1500))  # ~13,000 characters, no loop to stop
        server.enqueue(call("read_file", {"path": "greet.py"}, reasoning=thinking, chunk_interval_s=0.005))
        with json_logs() as out:
            run_in_process(config, now=clock_from(datetime(2026, 11, 30, 6, 29, 58, tzinfo=timezone.utc)))
        cancelled = _one(events_of(out), "iteration_cancelled")
        assert cancelled["why"] == "deadline" and cancelled["tokens"] > 500, cancelled
        report = report_json(config, capsys)
        assert report["run"]["tokens"] == report["tasks"][0]["iterations"][0]["tokens"] == cancelled["tokens"]

    @pytest.mark.parametrize(("setting", "said"), [("Not/AZone", True), ("EST24", True), ("Europe/Berlin", False)])
    def test_a_deadline_on_the_utc_a_tz_the_c_library_cannot_read_leaves_is_said_once(self, tmp_path, setting, said):
        """TZ=Not/AZone leaves the C library on UTC, and `deadline = "06:30"` was read as UTC's with nothing said: one
        `deadline_read_in_utc` names the TZ and the deadline's instant (+00:00). So for TZ=EST24, whose offset of a day
        no datetime holds (the night was a traceback, exit 1). A TZ naming a zone says nothing; nor does the step
        summary, which shows the deadline on that clock, say it a second time (`report_times_in_utc`)."""
        from tests.test_report_text import closed_port
        from tests.test_schedule import zone_file

        zone_file("Europe/Berlin")  # skipped on a host without a zone database
        repo = make_repo(tmp_path / "repo", SAMPLE_FILES)
        config = write_config(tmp_path / "overnight.toml", api_base=f"http://127.0.0.1:{closed_port()}/v1", repo=repo, night={"deadline": "06:30"})
        night = _json_run(config, {"TZ": setting})
        assert night.exit_code == 3, night.events
        said_so = [e for e in night.events if e["event"] == "deadline_read_in_utc"]
        # Once: the step summary, which shows that deadline on the same clock, does not say it again.
        assert "report_times_in_utc" not in [e["event"] for e in night.events]
        if not said:
            assert said_so == []
            return
        [warning] = said_so
        assert (warning["tz"], warning["deadline"], warning["run_id"]) == (setting, "06:30", _run_id_of_the_night(night.events))
        assert warning["at"].endswith("T06:30:00+00:00") and warning["level"] == "warning"


class TestBudgetEvents:
    def test_a_night_budget_spent_by_the_last_answer_stopped_nothing_early(self, config_file, server):
        """The answer that crossed `max_tokens_per_night` was the night's last (its submit committed): no task
        was refused or cut short, and `stopped_early` named the budget all the same, sending the morning to
        look for work it had stopped (found by a review). Null, as for a night that ran its course."""
        from tests.test_unattended import run_in_process

        config = config_file(night={"max_tokens_per_night": 1000})
        server.enqueue(
            call("edit_file", {"path": "greet.py", "old": "'helo'", "new": "'hello'"}, prompt_tokens=100, completion_tokens=1),
            call("submit", {"summary": "fixed"}, prompt_tokens=1999, completion_tokens=1),
        )
        with json_logs() as out:
            result = run_in_process(config)
        [task] = result.tasks
        assert (task.outcome.value, result.exit_code) == ("succeeded", 0)
        night = _one(events_of(out), "night_finished")
        assert (night["exit_code"], night["succeeded"], night["stopped_early"]) == (0, 1, None)

    def test_a_night_budget_that_refused_a_task_stopped_the_night_early(self, config_file, server):
        from tests.test_unattended import run_in_process

        tasks = [{"name": name, "prompt": "p", "check": "false"} for name in ("a", "b")]
        config = config_file(tasks=tasks, night={"max_iterations": 1, "max_tokens_per_night": 1000})
        server.enqueue(call("submit", {"summary": "x"}, prompt_tokens=1999, completion_tokens=1))
        with json_logs() as out:
            result = run_in_process(config)
        assert [(task.outcome.value, task.reason) for task in result.tasks] == [
            ("failed", "check_failed"), ("cancelled", "night token budget of 1000 spent")
        ]
        night = _one(events_of(out), "night_finished")
        assert (night["exit_code"], night["stopped_early"]) == (1, "night token budget of 1000 spent")


class TestFencesUnavailable:
    def test_a_git_too_old_for_the_fences_is_said_and_the_night_goes_on(self, tmp_path):
        """A git older than 2.32 ignores the settings the fences give through the environment:
        `agent_fences_unavailable` says so (`reason`), and the night runs without them."""
        shims = tmp_path / "bin"
        shims.mkdir()
        real_git = subprocess.run(["sh", "-c", "command -v git"], capture_output=True, text=True, check=True).stdout.strip()
        (shims / "git").write_text(f'#!/bin/sh\n[ "$1" = version ] && echo "git version 2.25.1" && exit 0\nexec {real_git} "$@"\n')
        (shims / "git").chmod(0o755)
        repo = make_repo(tmp_path / "repo", SAMPLE_FILES)
        task = {**TWO_TASKS[0], "tools": ["run_command", "list_dir", "read_file", "edit_file", "run_check", "submit"]}
        # The fences are made for the agent's first command.
        with ScriptedServer([call("run_command", {"command": "git status --short"}), *FIX]) as server:
            config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, tasks=[task])
            night = _json_run(config, env={"PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"})
        assert night.exit_code == 0, night.events
        unavailable = _one(night.events, "agent_fences_unavailable")
        assert "git 2.25 is older than 2.32" in unavailable["reason"]


class TestTranscriptNotRemoved:
    def test_an_old_transcript_that_cannot_be_deleted_is_logged_and_the_night_runs(self, tmp_path):
        """`transcript_not_removed` (`error`: the file and why); the night goes on. The file is made
        immutable (`chattr +i`), which stops even root; skipped where that cannot be set."""
        repo = make_repo(tmp_path / "repo", SAMPLE_FILES)
        config = write_config(tmp_path / "overnight.toml", api_base="http://127.0.0.1:9/v1", repo=repo, state={"keep_transcripts_days": 7})
        old = tmp_path / "state" / "transcripts" / "task-run-1-fix-greet-1.jsonl"
        old.parent.mkdir(parents=True)
        old.write_text("{}\n")
        os.utime(old, (time.time() - 40 * 86400,) * 2)
        if subprocess.run(["chattr", "+i", str(old)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not possible here")
        try:
            night = _json_run(config)
        finally:
            subprocess.run(["chattr", "-i", str(old)], check=True)
        assert night.exit_code == 3, night.events  # the model's closed port: the night ran
        failed = _one(night.events, "transcript_not_removed")
        assert failed["error"].startswith(f"{old}: ") and "run_id" not in failed
        assert "transcripts_removed" not in [e["event"] for e in night.events]


def _logged_event_names() -> set[str]:
    """Every event name the product's code logs by name: the first argument of a logger call."""
    import ast
    import re

    root = Path(__file__).parent.parent
    methods = {"debug", "info", "warning", "error", "exception", "_log"}
    names: set[str] = set()
    for package in ("orchestrator", "guards", "runs"):
        for source in (root / package).rglob("*.py"):
            for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in methods and node.args):
                    continue
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str) and re.fullmatch(r"[a-z]+(_[a-z]+)*", first.value):
                    names.add(first.value)
    return names


class TestEventNamesDocumented:
    def test_every_event_the_code_logs_is_named_in_the_reference(self):
        """Each event name the code logs is in docs/reference.md's "Log events", the list log pipelines match on."""
        reference = (Path(__file__).parent.parent / "docs" / "reference.md").read_text(encoding="utf-8")
        listed = reference.split("## Log events", 1)[1]
        logged = _logged_event_names()
        assert {"night_started", "signal", "lease_lost", "scheduler_started"} <= logged  # the scan finds them
        assert sorted(name for name in logged if f"`{name}`" not in listed) == []

    def test_every_event_the_reference_lists_is_one_the_code_has(self):
        """Each event a line of reference.md's "Log events" list opens with is one the code logs: by that name, or by a
        string it holds the name in (APScheduler's events, a task skipped as its earlier run ended it). No dead names."""
        import ast
        import re

        root = Path(__file__).parent.parent
        reference = (root / "docs" / "reference.md").read_text(encoding="utf-8")
        listed = reference.split("## Log events", 1)[1].split("\nEvents:\n", 1)[1]
        heads = [re.split(r"[(;]", item, maxsplit=1)[0] for item in re.findall(r"^- (.*)", listed, re.MULTILINE)]
        documented = {name for head in heads for name in re.findall(r"`([a-z_]+)`", head)}
        sources = [source for package in ("orchestrator", "guards", "runs") for source in (root / package).rglob("*.py")]
        kept = {node.value for source in sources for node in ast.walk(ast.parse(source.read_text(encoding="utf-8")))
                if isinstance(node, ast.Constant) and isinstance(node.value, str)}
        assert {"night_started", "task_skipped_parked_earlier_tonight", "lease_renew_failed"} <= documented  # the scan finds them
        assert sorted(documented - _logged_event_names() - kept) == []
