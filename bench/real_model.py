"""What the embedded model really does on the sample repository, as a table.

    python bench/real_model.py            # run a night in a temp dir, print the table
    python bench/real_model.py --save     # also write bench/real_model.md

Per task and iteration: outcome, reason code, turns, tokens, model calls, wall
seconds; then how often each reason code came up. Needs the [local] extra.
"""

from __future__ import annotations

import argparse
import logging
import platform
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.build import open_store  # noqa: E402
from orchestrator.cpu_threads import default_threads  # noqa: E402
from orchestrator.demo import prepare_sample, run_sample_night  # noqa: E402
from orchestrator.logs import configure_logging  # noqa: E402

HEADER = ("task", "iter", "outcome", "reason", "turns", "tokens", "model calls", "wall s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", action="store_true", help="also write the table to bench/real_model.md")
    args = parser.parse_args()
    configure_logging("human", level=logging.ERROR)  # signals are printed below; the table is the output
    workdir = Path(tempfile.mkdtemp(prefix="overnight-bench-"))
    config = prepare_sample(workdir)
    print(f"running the sample night in {workdir} (a few minutes)…", file=sys.stderr, flush=True)
    started = time.monotonic()
    result = run_sample_night(config, on_signal=lambda signal: print(f"  {signal.level.value}: {signal.kind}", file=sys.stderr, flush=True))
    wall = time.monotonic() - started
    store = open_store(config)
    try:
        run = store.run(result.run_id)
    finally:
        store.close()
    rows, reasons = [], Counter()
    for task in run.tasks:
        for it in task.iterations:
            seconds = (it.finished_at - it.started_at).total_seconds() if it.finished_at else float("nan")
            rows.append((task.name, it.number, it.outcome, it.reason or "-", it.turns, it.tokens, it.model_calls, f"{seconds:.1f}"))
            reasons[it.reason or "(committed)"] += 1
    text = _markdown(rows, reasons, wall, config.night.max_turns, config.model.max_tokens)
    print(text)
    if args.save:
        target = Path(__file__).with_suffix(".md")
        target.write_text(text, encoding="utf-8")
        print(f"wrote {target}", file=sys.stderr)
    return 0


def _markdown(rows: list[tuple], reasons: Counter, wall: float, max_turns: int, max_tokens: int) -> str:
    lines = [
        "# The embedded model (Gemma 3 270M Q4_K_M) on the sample repository",
        "",
        f"`python bench/real_model.py` · {platform.machine()}, {default_threads()} thread(s) · "
        f"max_turns {max_turns}, max_tokens {max_tokens}, temperature 0 · night took {wall:.0f} s",
        "",
        _row(HEADER),
        _row(["---"] * len(HEADER)),
        *(_row(row) for row in rows),
        "",
        _row(("reason code", "iterations")),
        _row(("---", "---")),
        *(_row((reason, count)) for reason, count in reasons.most_common()),
    ]
    return "\n".join(lines) + "\n"


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


if __name__ == "__main__":
    sys.exit(main())
