"""Several tasks at once: throughput against the ideal, and the orchestrator's own CPU per model call.

    python bench/concurrency.py [--tasks 8] [--calls 20] [--latency 0.05]

The scripted model server runs in a separate process with a fixed latency per
model call, so its CPU is not counted as ours. For N in 1, 2, 4, 8 the same
night (8 tasks, each `--calls` model calls: writes, then submit, check `true`)
runs at concurrency N, after one untimed warm-up night (imports and first-use
caches are a once-per-process cost). Ideal throughput is N / latency model calls per second.
Bars: at least 90% of ideal at every N; under 5 ms of orchestrator CPU per call.
"of which litellm" is the CPU of the model-call threads (litellm and its HTTP
client), a part of the process CPU shown beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

SERVER = """
import json, sys, time
from orchestrator.fake_server import ScriptedServer
from orchestrator.scripted import call
calls, latency = int(sys.argv[1]), float(sys.argv[2])
def respond(body):
    turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
    if turn + 1 >= calls:
        return call("submit", {"summary": "done"}, delay_s=latency)
    return call("write_file", {"path": f"out/{turn}.txt", "content": f"line {turn}"}, delay_s=latency)
server = ScriptedServer(responder=respond).start()
print(server.url, flush=True)
sys.stdin.read()
"""


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@x"}
    (path / "README").write_text("bench\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "init"]):
        subprocess.run(["git", *args], cwd=path, env=env, check=True)
    return path


def night(url: str, workdir: Path, tasks: int, concurrency: int, calls: int) -> dict[str, float]:
    from orchestrator.build import night_parts
    from orchestrator.config import load_config
    from orchestrator.night import run_night

    repo = make_repo(workdir / "repo")
    config_path = workdir / "overnight.toml"
    lines = [
        "[model]", 'name = "openai/bench"', f'api_base = "{url}"', "request_timeout_s = 30", "retries = 0",
        "[repo]", f'path = "{repo}"', "[state]", 'dir = "state"',
        "[night]", "max_iterations = 1", f"max_turns = {calls + 2}", f"concurrency = {concurrency}",
    ]
    for index in range(tasks):
        lines += ["[[task]]", f'name = "t{index}"', 'prompt = "write"', 'check = "true"', 'tools = ["write_file", "submit"]']
    config_path.write_text("\n".join(lines) + "\n")
    config = load_config(config_path)
    with night_parts(config) as parts:
        parts = dataclasses.replace(parts, on_signal=lambda signal: None)
        cpu0, children0, wall0 = time.process_time(), os.times(), time.perf_counter()
        client0 = parts.model.client_cpu_s
        result = run_night(parts)
        client_cpu = parts.model.client_cpu_s - client0
        wall = time.perf_counter() - wall0
        cpu = time.process_time() - cpu0
        after = os.times()
        child_cpu = (after.children_user - children0.children_user) + (after.children_system - children0.children_system)
        run = parts.store.run(result.run_id)
    model_calls = sum(
        1 for task in run.tasks for it in task.iterations for _ in range(it.turns)
    )
    succeeded = sum(1 for task in run.tasks if task.outcome == "succeeded")
    return {"wall": wall, "cpu": cpu, "client_cpu": client_cpu, "child_cpu": child_cpu, "calls": model_calls, "succeeded": succeeded}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--latency", type=float, default=0.05)
    args = parser.parse_args()

    from orchestrator.logs import configure_logging

    # The product's own logging (JSON lines, info level), written to nowhere: its cost counts, its text does not.
    configure_logging("json", stream=open(os.devnull, "w"))
    import litellm  # noqa: F401  - imported before timing: a one-off cost, not per call

    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(args.calls), str(args.latency)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    url = server.stdout.readline().strip()
    rows = []
    try:
        # One untimed night first: imports (SQLAlchemy, litellm's lazy modules) and
        # first-use caches are paid once per process, not per model call.
        with tempfile.TemporaryDirectory() as tmp:
            night(url, Path(tmp), 1, 1, args.calls)
        for concurrency in (1, 2, 4, 8):
            with tempfile.TemporaryDirectory() as tmp:
                figures = night(url, Path(tmp), args.tasks, concurrency, args.calls)
            ideal = concurrency / args.latency
            throughput = figures["calls"] / figures["wall"]
            rows.append((concurrency, figures, throughput, ideal))
    finally:
        server.stdin.close()
        server.wait(timeout=10)

    print(f"{args.tasks} tasks × {args.calls} model calls, {args.latency * 1000:.0f} ms latency per call (server in its own process)\n")
    print(
        f"{'N':>2}  {'tasks ok':>8}  {'calls':>5}  {'wall s':>6}  {'calls/s':>7}  {'ideal':>6}  {'of ideal':>8}  "
        f"{'CPU ms/call':>11}  {'of which litellm':>16}  {'git+check ms/call':>17}"
    )
    passed = True
    for concurrency, figures, throughput, ideal in rows:
        fraction = throughput / ideal
        cpu_ms = 1000 * figures["cpu"] / figures["calls"]
        child_ms = 1000 * figures["child_cpu"] / figures["calls"]
        client_ms = 1000 * figures["client_cpu"] / figures["calls"]
        passed &= fraction >= 0.9 and cpu_ms < 5 and figures["succeeded"] == args.tasks
        print(
            f"{concurrency:>2}  {figures['succeeded']:>8.0f}  {figures['calls']:>5.0f}  {figures['wall']:>6.2f}  "
            f"{throughput:>7.1f}  {ideal:>6.0f}  {fraction:>7.0%}  {cpu_ms:>11.2f}  {client_ms:>16.2f}  {child_ms:>17.2f}"
        )
    print("\nbars: >= 90% of ideal at every N, < 5 ms orchestrator CPU per model call:", "PASS" if passed else "FAIL")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
