"""docs/ci.md's GitHub Actions workflow and GitLab CI job, read from the document and run as a CI job runs them:
each `run:` step's shell commands under `bash -e` (GitHub's default shell), in a real clone of a real repository,
against the scripted model server. An outside review."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from orchestrator.fake_server import ScriptedServer
from orchestrator.scripted import Reply, call
from tests.conftest import GIT_ENV, SAMPLE_FILES, git, make_repo, write_config
from tests.test_night import FIX

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
OVERNIGHT = Path(sys.prefix) / "bin" / "overnight"
TASKS = [
    {"name": "fix-greet", "prompt": "greet() should return 'hello'.", "check": "python check_greet.py"},
    {"name": "never", "prompt": "make false succeed", "check": "false"},
]
# fix-greet succeeds; `never` changes nothing and its check fails: the night exits 1.
SCRIPT = [*FIX, call("submit", {"summary": "nothing"})]


def documented_yaml() -> tuple[dict[str, Any], dict[str, Any]]:
    """The GitHub workflow and the GitLab job, parsed from docs/ci.md."""
    text = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
    github, gitlab = (yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, re.S))
    return github, gitlab["overnight"]


def github_steps() -> list[dict[str, Any]]:
    github, _ = documented_yaml()
    return github["jobs"]["night"]["steps"]


def step_named(name: str) -> dict[str, Any]:
    [step] = [step for step in github_steps() if step.get("name") == name]
    return step


def job_environment(folder: Path) -> dict[str, str]:
    """The runner's environment: overnight (this checkout's) and the checks' python on PATH."""
    if not OVERNIGHT.exists():
        pytest.skip("overnight is not installed in this environment")
    return {
        **os.environ, **GIT_ENV, "PYTHONPATH": str(ROOT), "PATH": f"{OVERNIGHT.parent}{os.pathsep}{os.environ['PATH']}",
        "GITHUB_STEP_SUMMARY": str(folder / "step-summary.md"), "NO_COLOR": "1",
    }


def workspace(folder: Path, server: ScriptedServer, **model: Any) -> tuple[Path, Path]:
    """A bare 'origin' holding a repository with overnight.toml, and a job's clone of it (the checkout)."""
    source = make_repo(folder / "source", SAMPLE_FILES)
    write_config(source / "overnight.toml", api_base=server.url, repo=source, tasks=TASKS, model=model or None, night={"max_iterations": 1})
    # The documented config keeps its state in the default `.overnight`, next to overnight.toml, and names no repo path.
    text = (source / "overnight.toml").read_text(encoding="utf-8")
    text = re.sub(r"\[repo\]\npath = .*\n\n\[state\]\ndir = \"state\"\n", "", text)
    (source / "overnight.toml").write_text(text, encoding="utf-8")
    git(source, "add", "overnight.toml")
    git(source, "commit", "-q", "-m", "overnight.toml")
    origin = folder / "origin.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(source), str(origin)], check=True)
    checkout = folder / "checkout"
    subprocess.run(["git", "clone", "-q", str(origin), str(checkout)], check=True)
    return origin, checkout


def run_step(step: dict[str, Any], checkout: Path, env: dict[str, str], origin: Path) -> subprocess.CompletedProcess[str]:
    """One `run:` step, as GitHub runs it (`bash -e` on a script file), the push aimed at the local origin."""
    script = re.sub(r'"https://[^"]*"', f'"{origin}"', step["run"])
    (checkout.parent / "step.sh").write_text(script, encoding="utf-8")
    return subprocess.run(
        ["bash", "-e", str(checkout.parent / "step.sh")], cwd=checkout, env=env, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=180,
    )


class TestTheDocumentedJobs:
    def test_every_step_after_the_night_runs_when_the_night_failed(self) -> None:
        """A night whose tasks fail exits 1: the report, artifacts, JUnit and push steps still run (GitHub),
        after_script and the artifacts too (GitLab), and keep the files the night wrote."""
        steps = github_steps()
        night = steps.index(step_named("Run the night"))
        assert steps[night + 1:] and all(step.get("if") == "always()" for step in steps[night + 1:])
        upload = next(step for step in steps if str(step.get("uses", "")).startswith("actions/upload-artifact"))
        kept = set(upload["with"]["path"].split())
        assert kept == {"notes.md", "report.json", "overnight-junit.xml"}
        _, gitlab = documented_yaml()
        assert gitlab["artifacts"]["when"] == "always"
        assert set(gitlab["artifacts"]["paths"]) == kept and gitlab["artifacts"]["reports"]["junit"] == "overnight-junit.xml"
        assert any("overnight run" in line and "--junit overnight-junit.xml" in line for line in gitlab["script"])
        assert any("report.json" in line for line in gitlab["after_script"])

    def test_the_workflows_steps_run_a_night_and_keep_its_files(self, tmp_path: Path) -> None:
        """The steps as written: the night exits 1 (a task failed), and the report step after it still
        makes notes.md, report.json and the JUnit file where the upload step looks for them; the push
        step pushes the task branches, which the next job's first step makes local branches again."""
        with ScriptedServer(SCRIPT) as server:
            origin, checkout = workspace(tmp_path, server)
            env = job_environment(tmp_path)
            ran = {name: run_step(step_named(name), checkout, env, origin) for name in (
                "Take up the task branches earlier nights pushed", "Run the night", "Morning report",
                "Push the task branches for review",
            )}

        assert ran["Run the night"].returncode == 1, ran["Run the night"].stderr
        for name in ("Take up the task branches earlier nights pushed", "Morning report", "Push the task branches for review"):
            assert ran[name].returncode == 0, (name, ran[name].stderr)
        report = json.loads((checkout / "report.json").read_text(encoding="utf-8"))
        assert {task["name"]: task["outcome"] for task in report["tasks"]} == {"fix-greet": "succeeded", "never": "failed"}
        assert "never" in (checkout / "notes.md").read_text(encoding="utf-8")
        cases = ET.parse(checkout / "overnight-junit.xml").getroot().iter("testcase")
        assert sorted(case.get("name") for case in cases) == ["fix-greet", "never"]
        assert "fix-greet" in (tmp_path / "step-summary.md").read_text(encoding="utf-8")
        pushed = git(origin, "rev-parse", "overnight/fix-greet")
        assert pushed == git(checkout, "rev-parse", "overnight/fix-greet")

        # The next night's fresh checkout: its first step makes the pushed branch a local one again.
        subprocess.run(["git", "clone", "-q", str(origin), str(tmp_path / "next")], check=True)
        taken_up = run_step(step_named("Take up the task branches earlier nights pushed"), tmp_path / "next", env, origin)
        assert taken_up.returncode == 0, taken_up.stderr
        assert git(tmp_path / "next", "rev-parse", "refs/heads/overnight/fix-greet") == pushed

    def test_the_gitlab_job_takes_up_the_branches_earlier_nights_pushed(self, tmp_path: Path) -> None:
        """GitLab's clone fetches the pipeline's branch alone (`+<sha>:refs/pipelines/<id>` and
        `+refs/heads/<name>:refs/remotes/origin/<name>`), not every branch as GitHub's `fetch-depth: 0` does:
        the script's first line found no `origin/overnight/*`, the night started each task again from
        `[repo] base`, and the plain push of that work was then refused (an outside review)."""
        source = make_repo(tmp_path / "source", SAMPLE_FILES)
        git(source, "checkout", "-q", "-b", "overnight/fix-greet")
        (source / "greet.py").write_text("def greet():\n    return 'hello'\n")
        git(source, "commit", "-q", "-am", "last night's work")
        git(source, "checkout", "-q", "main")
        origin = tmp_path / "origin.git"
        subprocess.run(["git", "clone", "-q", "--bare", str(source), str(origin)], check=True)
        # The job's checkout, fetched as gitlab-runner fetches a scheduled pipeline's branch.
        checkout, tip = tmp_path / "checkout", git(source, "rev-parse", "main")
        for command in (["init", "-q", str(checkout)], ["-C", str(checkout), "remote", "add", "origin", str(origin)],
                        ["-C", str(checkout), "fetch", "-q", "origin", f"+{tip}:refs/pipelines/1", "+refs/heads/main:refs/remotes/origin/main"],
                        ["-C", str(checkout), "checkout", "-q", "-f", tip]):
            subprocess.run(["git", *command], check=True, env={**os.environ, **GIT_ENV})
        _, gitlab = documented_yaml()
        taking_up = [line for line in gitlab["script"] if line.startswith("git fetch")]
        done = run_step({"run": "\n".join(taking_up)}, checkout, {**os.environ, **GIT_ENV}, origin)
        assert done.returncode == 0, done.stderr
        assert git(checkout, "rev-parse", "refs/heads/overnight/fix-greet") == git(source, "rev-parse", "overnight/fix-greet")

    def test_a_cancelled_github_job_rolls_the_night_back(self, tmp_path: Path) -> None:
        """GitHub cancels a step (Cancel workflow, or `timeout-minutes` run out) by sending SIGINT to the
        step's shell alone, SIGTERM 7.5 s later, then killing that shell. A bash waiting for its command
        passes neither on: the night went on, orphaned, its iteration half done and its state lock held,
        while the `if: always()` steps reported and pushed. The step runs the night in the shell's place."""
        code, alive, scratch, runs, _ = cancel_a_step(tmp_path, step_named("Run the night")["run"], group=False)

        assert not alive, "the night outlived its step"
        assert code == 130  # interrupted: the iteration in flight rolled back
        assert not scratch.exists()
        assert runs == [("cancelled", 130)]

    def test_a_cancelled_gitlab_job_rolls_the_night_back_and_after_script_keeps_its_files(self, tmp_path: Path) -> None:
        """GitLab's shell executor stops a job (timeout, cancelled pipeline) with SIGTERM to the job's process
        group: the night's line as the script has it rolls back and exits 143, as the exit-code table says,
        and after_script, as written, keeps a report and a JUnit file that say so."""
        _, gitlab = documented_yaml()
        [line] = [line for line in gitlab["script"] if line.startswith("overnight run")]
        after_script = [line for line in gitlab["after_script"] if not line.startswith(". .venv")]
        code, alive, scratch, runs, checkout = cancel_a_step(tmp_path, line, group=True, then="\n".join(after_script))

        assert not alive, "the night outlived its job"
        assert code != 0 and not scratch.exists()
        assert runs == [("cancelled", 143)]
        report = json.loads((checkout / "report.json").read_text(encoding="utf-8"))
        assert (report["run"]["status"], report["run"]["exit_code"]) == ("cancelled", 143)
        properties = {p.get("name"): p.get("value") for p in ET.parse(checkout / "overnight-junit.xml").getroot().iter("property")}
        assert properties["exit_code"] == "143"


def cancel_a_step(
    tmp_path: Path, script_text: str, *, group: bool, then: str = ""
) -> tuple[int, list[int], Path, list[tuple[Any, ...]], Path]:
    """Run `script_text` under `bash -e` in a job's checkout; once the night has made its first edit, stop it
    as the CI runner does: GitHub (`group=False`) SIGINT to the shell, SIGTERM 7.5 s later, then kill 2.5 s
    after that; GitLab (`group=True`) SIGTERM to the shell's process group. Then `then` (after_script) at once, in a
    fresh `bash -e`: what waits for the night to end is the script's own. The shell's exit code, the night processes still alive (killed after), the half-done
    edit's path, the stored runs' (status, exit_code) and the checkout."""
    replies = [call("write_file", {"path": "scratch.txt", "content": "half-done"}), Reply(text="thinking", delay_s=60)]
    with ScriptedServer(replies) as server:
        origin, checkout = workspace(tmp_path, server, request_timeout_s=120)
        env = job_environment(tmp_path)
        script = tmp_path / "step.sh"
        script.write_text(script_text + "\n", encoding="utf-8")
        step = subprocess.Popen(["bash", "-e", str(script)], cwd=checkout, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=group)
        scratch = checkout / ".overnight" / "worktrees" / "fix-greet" / "scratch.txt"
        try:
            deadline = time.monotonic() + 60
            while not scratch.exists():
                assert step.poll() is None and time.monotonic() < deadline, "the night never wrote its first edit"
                time.sleep(0.05)
            time.sleep(0.5)
            if group:
                os.killpg(step.pid, signal.SIGTERM)
                code = step.wait(timeout=30)
            else:
                step.send_signal(signal.SIGINT)  # the runner's first signal, to the step's process only
                try:
                    code = step.wait(timeout=7.5)
                except subprocess.TimeoutExpired:
                    step.send_signal(signal.SIGTERM)
                    try:
                        code = step.wait(timeout=2.5)
                    except subprocess.TimeoutExpired:
                        step.kill()
                        code = step.wait()
            if then:  # at once, as GitLab does: the job's shell dies at once, the night rolls back a second more
                after = run_step({"run": then}, checkout, env, origin)
                assert after.returncode == 0, after.stderr
            time.sleep(0.5)
        finally:
            if step.poll() is None:
                step.kill()
                step.wait()
            alive = [pid for pid in _night_pids(checkout) if _alive(pid)]
            for pid in alive:
                os.kill(pid, signal.SIGKILL)
    with sqlite3.connect(checkout / ".overnight" / "runs.db") as connection:
        runs = connection.execute("SELECT status, exit_code FROM runs").fetchall()
    return code, alive, scratch, runs, checkout


def _night_pids(checkout: Path) -> list[int]:
    database = checkout / ".overnight" / "runs.db"
    if not database.exists():
        return []
    with sqlite3.connect(database) as connection:
        return [pid for (pid,) in connection.execute("SELECT pid FROM runs")]


def _alive(pid: int) -> bool:
    try:
        return b"overnight" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
