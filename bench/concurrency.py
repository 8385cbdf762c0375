"""Several tasks at once: throughput against the ideal, and the orchestrator's own CPU per model call.

    python bench/concurrency.py [--tasks 8] [--calls 20] [--latency 0.05] [--repeat 3] [--concurrency N ...]

The scripted model server runs in a separate process with a fixed latency per
model call (from the request's arrival to its answer), so its CPU is not
counted as ours. For N in 1, 2, 4, 8 the same night (8 tasks, each `--calls`
model calls: writes, then submit, check `true`) runs at concurrency N, after
one untimed warm-up night (imports and first-use caches are a once-per-process
cost). Ideal throughput is N / latency model calls per second.

Each N is measured three ways, side by side in one run:
  first night  a fresh state dir: every task's worktree is created (git cannot
               create two at once, so at high N the last task starts late)
  later night  the same state dir again: worktrees are reused, as on every
               night after a task's first
  client only  the model client alone (EndpointModel, the same growing
               conversation, N threads): the ceiling this machine and server
               allow, with no orchestrator around the calls
Each cell is the median of `--repeat` runs (the machines are shared and noisy); the
repeats go round-robin over N, so a noisy minute does not land on one N alone.
Bars: at least 90% of ideal at every N; under 5 ms of orchestrator CPU per call.
"transport" is the CPU of sending requests and reading answers, a part of the
process CPU shown beside it; "git+check" is the CPU of git and check processes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

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

CONCURRENCY = (1, 2, 4, 8)


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@x"}
    (path / "README").write_text("bench\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "init"]):
        subprocess.run(["git", *args], cwd=path, env=env, check=True)
    return path


def write_config(url: str, workdir: Path, tasks: int, concurrency: int, calls: int) -> Path:
    repo = workdir / "repo"
    if not repo.exists():
        make_repo(repo)
    config_path = workdir / "overnight.toml"
    lines = [
        "[model]", 'name = "openai/bench"', f'api_base = "{url}"', "request_timeout_s = 30", "retries = 0",
        "[repo]", f'path = "{repo}"', "[state]", 'dir = "state"',
        "[night]", "max_iterations = 1", f"max_turns = {calls + 2}", f"concurrency = {concurrency}",
    ]
    for index in range(tasks):
        # Each task's prompt names it, so the timed model can tell whose call it saw.
        lines += ["[[task]]", f'name = "t{index}"', f'prompt = "write (t{index})"', 'check = "true"', 'tools = ["write_file", "submit"]']
    config_path.write_text("\n".join(lines) + "\n")
    return config_path


class TimedModel:
    """The night's model, noting when each task's calls left and returned (wall clock, as the run store's times)."""

    def __init__(self, model: object) -> None:
        self._model = model
        self._lock = threading.Lock()
        self.calls: dict[str, list[tuple[float, float]]] = {}

    def complete(self, messages, tools):
        task = next(m["content"] for m in messages if m["role"] == "user").split("(", 1)[1].split(")", 1)[0]
        sent = time.time()
        try:
            return self._model.complete(messages, tools)
        finally:
            with self._lock:
                self.calls.setdefault(task, []).append((sent, time.time()))

    def for_task(self, cancel):
        """The inner model's own for one task (the product's path: its own transport, the task's cancel), its calls
        timed here with the night's."""
        task_model = TimedModel(self._model.for_task(cancel))
        task_model._lock, task_model.calls = self._lock, self.calls
        return task_model

    def close(self) -> None:
        self._model.close()


def where_time_went(run, calls: dict[str, list[tuple[float, float]]], concurrency: int, wall: float, latency: float) -> dict[str, float]:
    """The night's N x wall slot-seconds, by what each slot was doing; the shares add up to 1.

    model: the calls' first `latency` seconds (the "of ideal" figure); slower: calls beyond it;
    start: a task begun, its first request not yet sent; between: a task between two calls
    (answer read, tools run, next request built); end: after the last answer (check, commit,
    bookkeeping); idle: no task in the slot (night start and end, waiting for a free slot).
    """
    total = concurrency * wall
    spans = {"model": 0.0, "slower": 0.0, "start": 0.0, "between": 0.0, "end": 0.0}
    for task in run.tasks:
        own = sorted(calls.get(task.name, []))
        begun, ended = task.started_at.timestamp(), task.finished_at.timestamp()
        in_calls = sum(back - sent for sent, back in own)
        spans["model"] += len(own) * latency
        spans["slower"] += in_calls - len(own) * latency
        spans["start"] += own[0][0] - begun
        spans["between"] += own[-1][1] - own[0][0] - in_calls
        spans["end"] += ended - own[-1][1]
    shares = {name: seconds / total for name, seconds in spans.items()}
    shares["idle"] = 1 - sum(shares.values())
    return shares


@contextlib.contextmanager
def scripted_server(calls: int, latency: float) -> Iterator[str]:
    """SERVER in its own process, so its CPU is not counted as ours; yields its URL."""
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(calls), str(latency)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        yield server.stdout.readline().strip()
    finally:
        server.stdin.close()
        server.wait(timeout=10)


def night(url: str, workdir: Path, tasks: int, concurrency: int, calls: int, latency: float = 0.05) -> dict[str, float]:
    """One night in `workdir` (a second call on the same workdir is a later night)."""
    from orchestrator.build import night_parts
    from orchestrator.config import load_config
    from orchestrator.night import run_night

    config = load_config(write_config(url, workdir, tasks, concurrency, calls))
    with night_parts(config) as parts:
        model, timed = parts.model, TimedModel(parts.model)
        parts = dataclasses.replace(parts, on_signal=lambda signal: None, model=timed)
        cpu0, children0, wall0, began = time.process_time(), os.times(), time.perf_counter(), time.time()
        client0 = model.client_cpu_s
        result = run_night(parts)
        client_cpu = model.client_cpu_s - client0
        wall = time.perf_counter() - wall0
        ended = time.time()
        cpu = time.process_time() - cpu0
        after = os.times()
        child_cpu = (after.children_user - children0.children_user) + (after.children_system - children0.children_system)
        run = parts.store.run(result.run_id)
    model_calls = sum(it.turns for task in run.tasks for it in task.iterations)
    succeeded = sum(1 for task in run.tasks if task.outcome == "succeeded")
    figures = {"wall": wall, "cpu": cpu, "client_cpu": client_cpu, "child_cpu": child_cpu, "calls": model_calls, "succeeded": succeeded}
    # The wall-clock span too, for nights in several processes (bench/processes.py).
    figures |= {"began": began, "ended": ended}
    return figures | {f"share_{name}": share for name, share in where_time_went(run, timed.calls, concurrency, wall, latency).items()}


def client_only(url: str, tasks: int, concurrency: int, calls: int) -> dict[str, float]:
    """The model client with nothing around it: `tasks` conversations of `calls` calls, `concurrency` at a time."""
    from concurrent.futures import ThreadPoolExecutor

    from orchestrator.cancel import CancelToken
    from orchestrator.config import ModelConfig
    from orchestrator.model import EndpointModel
    from orchestrator.tools import Toolbox

    model = EndpointModel(ModelConfig(name="openai/bench", api_base=url, request_timeout_s=30, retries=0), cancel=CancelToken())
    schemas = Toolbox(ROOT, ("write_file", "submit"), check_command="true").schemas()
    done = [0]
    lock = threading.Lock()

    def conversation(_: int) -> None:
        messages = [{"role": "system", "content": "bench"}, {"role": "user", "content": "write"}]
        for turn in range(calls):
            response = model.complete(messages, schemas)
            call = response.tool_calls[0]
            messages.append({"role": "assistant", "content": "", "tool_calls": [
                {"id": f"c{turn}", "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]})
            messages.append({"role": "tool", "tool_call_id": f"c{turn}", "content": "ok"})
            with lock:
                done[0] += 1

    wall0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(conversation, range(tasks)))
    wall = time.perf_counter() - wall0
    model.close()
    return {"wall": wall, "calls": done[0]}


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    """The run with the median throughput, with its own CPU figures; `succeeded` is the fewest of any run."""
    ranked = sorted(runs, key=lambda figures: figures["calls"] / figures["wall"])
    middle = dict(ranked[len(ranked) // 2])
    if "succeeded" in middle:
        middle["succeeded"] = min(figures["succeeded"] for figures in runs)
    return middle


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is shown")
    parser.add_argument("--concurrency", type=int, action="append", help="only this N (repeatable); default 1, 2, 4 and 8")
    args = parser.parse_args()

    from orchestrator.logs import configure_logging

    # The product's own logging (JSON lines, info level), written to nowhere: its cost counts, its text does not.
    configure_logging("json", stream=open(os.devnull, "w"))
    from orchestrator.litellm_transport import litellm_module

    litellm_module()  # imported before timing (context windows are looked up there): a one-off cost

    with scripted_server(args.calls, args.latency) as url:
        # One untimed night first: imports (SQLAlchemy, git) and first-use caches
        # are paid once per process, not per model call.
        with tempfile.TemporaryDirectory() as tmp:
            night(url, Path(tmp), 1, 1, args.calls)
        levels = args.concurrency or CONCURRENCY
        runs: dict[int, tuple[list, list, list]] = {concurrency: ([], [], []) for concurrency in levels}
        # Round-robin over N, so a noisy minute on a shared host spreads over every N
        # instead of landing on one.
        for _ in range(args.repeat):
            for concurrency in levels:
                firsts, laters, alones = runs[concurrency]
                with tempfile.TemporaryDirectory() as tmp:
                    firsts.append(night(url, Path(tmp), args.tasks, concurrency, args.calls, args.latency))
                    laters.append(night(url, Path(tmp), args.tasks, concurrency, args.calls, args.latency))
                alones.append(client_only(url, args.tasks, concurrency, args.calls))
        rows = [(concurrency, *map(_median, runs[concurrency])) for concurrency in levels]

    ideal_of = lambda n: n / args.latency  # noqa: E731
    fraction = lambda figures, n: figures["calls"] / figures["wall"] / ideal_of(n)  # noqa: E731
    per_call = lambda figures, key: 1000 * figures[key] / figures["calls"]  # noqa: E731
    print(f"{args.tasks} tasks × {args.calls} model calls, {args.latency * 1000:.0f} ms latency per call (server in its own process)\n")
    print(
        f"{'':>2}  {'':>5}  {'---------- first night ----------':>33}  {'---------- later night ----------':>33}  {'client only':>11}\n"
        f"{'N':>2}  {'ideal':>5}  {'of ideal':>8}  {'CPU ms/call':>11}  {'transport':>9}  "
        f"{'of ideal':>8}  {'CPU ms/call':>11}  {'git+check':>9}  {'of ideal':>11}"
    )
    passed = True
    for concurrency, first, later, alone in rows:
        for figures in (first, later):
            passed &= fraction(figures, concurrency) >= 0.9 and per_call(figures, "cpu") < 5
            passed &= figures["succeeded"] == args.tasks
        print(
            f"{concurrency:>2}  {ideal_of(concurrency):>5.0f}  "
            f"{fraction(first, concurrency):>8.0%}  {per_call(first, 'cpu'):>11.2f}  {per_call(first, 'client_cpu'):>9.2f}  "
            f"{fraction(later, concurrency):>8.0%}  {per_call(later, 'cpu'):>11.2f}  {per_call(later, 'child_cpu'):>9.2f}  "
            f"{fraction(alone, concurrency):>11.0%}"
        )
    names = ("model", "slower", "start", "between", "end", "idle")
    print(f"\nwhere the slots' time went (N x wall), later night: {', '.join(names)} (see where_time_went)")
    print(f"{'N':>2}  " + "  ".join(f"{name:>7}" for name in names))
    for concurrency, _, later, _ in rows:
        print(f"{concurrency:>2}  " + "  ".join(f"{later['share_' + name]:>7.1%}" for name in names))
    print("\nbars: >= 90% of ideal at every N, < 5 ms orchestrator CPU per model call:", "PASS" if passed else "FAIL")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
