"""A thread per task or a process per task: the same N tasks, side by side on this machine.

    python bench/processes.py [--calls 20] [--latency 0.05] [--repeat 5] [--concurrency N ...]

A night runs its tasks in threads of one process, under one GIL. Would a process
per task, with no GIL between the tasks, be faster? This measures the most
favourable version of that, without anything that sharing one night across
processes would cost: N worker processes, each with its own repository, state
dir and run store, each running a later night of one task; all N are told to
start at once and nothing coordinates them. Beside it, in the same run, the same
N tasks as one later night at concurrency N in threads (bench/concurrency.py's
night). The scripted server is bench/concurrency.py's, in its own process.

Throughput is model calls over the span from the first night's start to the last
one's end, as a share of N / latency; CPU is the orchestrator processes' own, per
model call (the workers' summed). Each cell is the median of `--repeat` runs,
round-robin over N. Nothing is asserted: the table is the answer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import concurrency  # noqa: E402

# One task's nights, run whenever the parent writes a line; each answered with its figures.
WORKER = """
import json, os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from bench import concurrency
from orchestrator.logs import configure_logging
configure_logging("json", stream=open(os.devnull, "w"))
url, workdir, calls, latency = sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
concurrency.night(url, workdir, 1, 1, calls, latency)  # the first night: worktree made, imports paid
print("ready", flush=True)
for _ in sys.stdin:
    print(json.dumps(concurrency.night(url, workdir, 1, 1, calls, latency)), flush=True)
"""


def in_processes(workers: list[subprocess.Popen[str]]) -> dict[str, float]:
    """One later night of one task in each worker, all started at once."""
    for worker in workers:
        worker.stdin.write("go\n")
        worker.stdin.flush()
    nights = [json.loads(worker.stdout.readline()) for worker in workers]
    return {
        "wall": max(n["ended"] for n in nights) - min(n["began"] for n in nights),
        "calls": sum(n["calls"] for n in nights),
        "cpu": sum(n["cpu"] for n in nights),
        "succeeded": sum(n["succeeded"] for n in nights),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--repeat", type=int, default=5, help="runs per cell; the median is shown")
    parser.add_argument("--concurrency", type=int, action="append", help="only this N (repeatable); default 2, 4 and 8")
    args = parser.parse_args()
    levels = args.concurrency or (2, 4, 8)

    from orchestrator.logs import configure_logging

    configure_logging("json", stream=open(os.devnull, "w"))
    workers: list[subprocess.Popen[str]] = []
    with concurrency.scripted_server(args.calls, args.latency) as url, tempfile.TemporaryDirectory() as tmp:
        try:
            for index in range(max(levels)):
                workdir = Path(tmp) / f"process-{index}"
                workdir.mkdir()
                workers.append(subprocess.Popen(
                    [sys.executable, "-c", WORKER, str(ROOT), url, str(workdir), str(args.calls), str(args.latency)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                ))
            for level in levels:  # each thread night's first night, while the workers start
                concurrency.night(url, Path(tmp) / f"threads-{level}", level, level, args.calls, args.latency)
            for worker in workers:
                if worker.stdout.readline().strip() != "ready":
                    raise SystemExit("a worker process did not start")
            runs: dict[int, tuple[list, list]] = {level: ([], []) for level in levels}
            for _ in range(args.repeat):
                for level in levels:
                    threads, processes = runs[level]
                    threads.append(concurrency.night(url, Path(tmp) / f"threads-{level}", level, level, args.calls, args.latency))
                    processes.append(in_processes(workers[:level]))
        finally:
            for worker in workers:
                worker.stdin.close()
                worker.wait(timeout=30)

    share = lambda figures, n: figures["calls"] / figures["wall"] / (n / args.latency)  # noqa: E731
    median = lambda figures, n: statistics.median(share(f, n) for f in figures)  # noqa: E731
    cpu = lambda figures: statistics.median(1000 * f["cpu"] / f["calls"] for f in figures)  # noqa: E731
    print(f"N tasks × {args.calls} model calls, {args.latency * 1000:.0f} ms latency per call, later nights, median of {args.repeat}\n")
    print(f"{'':>2}  {'---- of ideal ----':>28}  {'-- CPU ms/call --':>21}")
    print(f"{'N':>2}  {'threads':>8}  {'processes':>9}  {'ratio':>7}  {'threads':>9}  {'processes':>9}")
    for level in levels:
        threads, processes = runs[level]
        if any(f["succeeded"] != level for f in threads + processes):
            print(f"N = {level}: not every task succeeded; the figures are not comparable")
            return 1
        print(
            f"{level:>2}  {median(threads, level):>8.1%}  {median(processes, level):>9.1%}  "
            f"{median(processes, level) / median(threads, level):>7.2f}  {cpu(threads):>9.2f}  {cpu(processes):>9.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
