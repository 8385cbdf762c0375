"""The struggle benchmark: our guards against the anchors' policies, on one library of runs.

    python bench/struggle.py

Every trajectory in bench/trajectories.py runs through the real agent loop
(orchestrator.agent.run_agent) with the scripted model and a real Toolbox over
a fresh temp project, once with our default guards and once per baseline.
Prints one row per trajectory and a summary; exits 1 when a bar is missed.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Sequence

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.baselines import BASELINES
from bench.trajectories import CHECK_COMMAND, FILES, Trajectory, library
from guards import HOOKS, default_guards
from orchestrator.agent import RunContext, run_agent
from orchestrator.config import GuardsConfig
from orchestrator.errors import QualityError
from orchestrator.protocols import Message
from orchestrator.records import Level, ModelResponse, Signal, ToolCall, ToolResult
from orchestrator.response_draft import Draft
from orchestrator.runaway import check_runaway
from orchestrator.scripted import ScriptedModel
from orchestrator.tool_names import ALL_TOOLS
from orchestrator.tools import Toolbox

OURS = "ours"
OVERHEAD_BAR_US = 50.0
PROMPT: list[Message] = [
    {"role": "system", "content": "You fix small Python projects. Use the tools; submit when run_check passes."},
    {"role": "user", "content": "greet() must return 'hello'. Fix it."},
]
# Chunk size the runaway detector is fed with, as a streaming server would send it.
_STREAM_CHUNK = 16


@dataclass(frozen=True)
class Detection:
    turn: int
    level: Level
    kind: str


@dataclass
class Run:
    """What one policy did on one trajectory."""

    signals: list[tuple[int, Signal]] = field(default_factory=list)
    turn_tokens: dict[int, int] = field(default_factory=dict)
    stopped: str = ""
    submitted: bool = False
    hook_ns_per_call: list[float] = field(default_factory=list)

    def first(self, kinds: Sequence[str]) -> Detection | None:
        """The first signal of an accepted kind, or any severe one but running out of turns."""
        for turn, signal in self.signals:
            if signal.kind in kinds or (signal.level is Level.SEVERE and signal.kind != "max_turns"):
                return Detection(turn, signal.level, signal.kind)
        return None

    def tokens_between(self, start: int, end: int) -> int:
        return sum(tokens for turn, tokens in self.turn_tokens.items() if start <= turn <= end)


class RunawayCheckedModel:
    """The scripted model, with each reply streamed through the real client's runaway detector.

    This feeds a `response_draft.Draft` chunk by chunk and calls `runaway.check_runaway`,
    exactly as `stream_reading.read_stream` does.
    """

    def __init__(self, inner: ScriptedModel, max_output_chars: int, ctx: RunContext, run: Run) -> None:
        self.inner, self.ctx, self.run = inner, ctx, run
        self.max_output_chars = max_output_chars

    def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> ModelResponse:
        response = self.inner.complete(messages, tools)
        self.run.turn_tokens[self.ctx.turn] = response.tokens
        draft = Draft()
        for index, text in [(None, response.text)] + list(enumerate(c.arguments for c in response.tool_calls)):
            for start in range(0, len(text), _STREAM_CHUNK):
                piece = text[start : start + _STREAM_CHUNK]
                if index is None:
                    draft.add_message(SimpleNamespace(content=piece))
                else:
                    function = SimpleNamespace(name=response.tool_calls[index].name, arguments=piece)
                    draft.add_message(SimpleNamespace(tool_calls=[SimpleNamespace(index=index, id="", function=function)]))
                check_runaway(draft, self.max_output_chars)
        return response


class _Recorder:
    def message(self, message: Message) -> None: ...

    def model_call(self, response: ModelResponse) -> None: ...

    def tool_call(self, call: ToolCall, result: ToolResult) -> None: ...


class _Timed:
    """A guard whose hooks add their time to the current turn's tally."""

    def __init__(self, inner: Any, tally: dict[int, int], calls: dict[int, int], ctx: RunContext, counts: bool) -> None:
        for hook in HOOKS:
            method = getattr(inner, hook, None)
            if method is not None:
                setattr(self, hook, self._timed(method, tally, ctx, calls if counts and hook == "after_tool_call" else None))

    @staticmethod
    def _timed(method: Callable[..., None], tally: dict[int, int], ctx: RunContext, calls: dict[int, int] | None):
        def timed(*args: Any) -> None:
            if calls is not None:
                calls[ctx.turn] = calls.get(ctx.turn, 0) + 1
            started = time.perf_counter_ns()
            try:
                method(*args)
            finally:
                tally[ctx.turn] = tally.get(ctx.turn, 0) + time.perf_counter_ns() - started

        return timed


def run_once(trajectory: Trajectory, policy: str) -> Run:
    """Play `trajectory` through the real loop with `policy`'s guards, in a fresh project."""
    run = Run()
    with tempfile.TemporaryDirectory(prefix="struggle-") as folder:
        root = Path(folder)
        for name, content in FILES.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(content)
        toolbox = Toolbox(root, ALL_TOOLS, check_command=CHECK_COMMAND, check_timeout_s=30, command_timeout_s=30)
        ctx = RunContext(
            max_turns=trajectory.max_turns,
            tool_names=toolbox.names(),
            sink=lambda signal: run.signals.append((ctx.turn, signal)),
            context_window=trajectory.context_window,
        )
        guards = default_guards(GuardsConfig()) if policy == OURS else BASELINES[policy]()
        tally: dict[int, int] = {}
        calls: dict[int, int] = {}
        timed = [_Timed(guard, tally, calls, ctx, counts=index == 0) for index, guard in enumerate(guards)]
        if policy == OURS:
            guards = timed  # only our hooks are timed; baselines run bare
        model = RunawayCheckedModel(ScriptedModel(trajectory.replies), trajectory.max_output_chars, ctx, run)
        try:
            result = run_agent(model, toolbox, guards, [dict(m) for m in PROMPT], ctx, _Recorder())
            run.submitted = bool(result.summary)
        except QualityError as stop:
            run.stopped = stop.reason
        for turn, ns in tally.items():
            count = max(calls.get(turn, 0), 1)
            run.hook_ns_per_call.extend([ns / count] * count)
    return run


# --- judging and printing -------------------------------------------------------


@dataclass(frozen=True)
class Row:
    trajectory: Trajectory
    ours: Run
    baselines: dict[str, Run]

    def detection(self, policy: str) -> Detection | None:
        run = self.ours if policy == OURS else self.baselines[policy]
        kinds = self.trajectory.accepted + ((policy,) if policy != OURS else ())
        return run.first(kinds)

    def best_baseline(self) -> int | None:
        turns = [d.turn for d in (self.detection(p) for p in self.baselines) if d is not None]
        return min(turns) if turns else None

    @property
    def false_stop(self) -> bool:
        return self.trajectory.healthy and any(s.level is Level.SEVERE for _, s in self.ours.signals)

    @property
    def false_warnings(self) -> int:
        if not self.trajectory.healthy:
            return 0
        return sum(1 for _, s in self.ours.signals if s.level is Level.WARNING)

    @property
    def beaten(self) -> bool:
        if self.trajectory.healthy:
            return False
        ours, best = self.detection(OURS), self.best_baseline()
        return best is not None and (ours is None or ours.turn > best)

    def verdict(self) -> str:
        if self.trajectory.healthy:
            if self.false_stop:
                return "FALSE STOP"
            if not self.ours.submitted:
                return "DID NOT FINISH"
            return "ok (false warning)" if self.false_warnings else "ok"
        if self.detection(OURS) is None:
            return "MISSED"
        return "LATER THAN BASELINE" if self.beaten else "ok"


def run_library(trajectories: Sequence[Trajectory] | None = None) -> list[Row]:
    rows = []
    for trajectory in trajectories or library():
        ours = run_once(trajectory, OURS)
        rows.append(Row(trajectory, ours, {name: run_once(trajectory, name) for name in BASELINES}))
    return rows


def _cell(detection: Detection | None) -> str:
    if detection is None:
        return "-"
    mark = "✖" if detection.level is Level.SEVERE else "⚠"
    return f"{mark}t{detection.turn}"


def _ours_cell(row: Row) -> str:
    if row.trajectory.healthy:
        severe = [s for _, s in row.ours.signals if s.level is Level.SEVERE]
        warnings = [s for _, s in row.ours.signals if s.level is Level.WARNING]
        if severe:
            return f"✖ {severe[0].kind}"
        return f"⚠ {warnings[0].kind}" if warnings else "quiet"
    found = row.detection(OURS)
    if found is None:
        return "not detected"
    mark = "✖" if found.level is Level.SEVERE else "⚠"
    return f"{mark} {found.kind} t{found.turn}"


def overhead_us(rows: Sequence[Row]) -> tuple[float, float]:
    samples = sorted(ns / 1000 for row in rows for ns in row.ours.hook_ns_per_call)
    if not samples:
        return 0.0, 0.0
    p95 = samples[min(len(samples) - 1, int(0.95 * len(samples)))]
    return statistics.median(samples), p95


def table(rows: Sequence[Row]) -> str:
    header = ("trajectory", "kind", "onset", "ours", "Δturns", "Δtokens", *BASELINES, "verdict")
    lines = []
    for row in rows:
        t = row.trajectory
        found = row.detection(OURS)
        lag_turns = lag_tokens = "-"
        if found is not None and not t.healthy:
            lag_turns = str(found.turn - t.onset)
            lag_tokens = str(row.ours.tokens_between(t.onset, found.turn))
        onset = "-" if t.healthy else str(t.onset)
        baseline_cells = [_cell(row.detection(name)) for name in BASELINES]
        lines.append((t.name, t.kind, onset, _ours_cell(row), lag_turns, lag_tokens, *baseline_cells, row.verdict()))
    widths = [max(len(str(line[i])) for line in [header, *lines]) for i in range(len(header))]
    render = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    rule = "  ".join("-" * w for w in widths)
    return "\n".join([render(header), rule, *(render(line) for line in lines)])


@dataclass(frozen=True)
class Summary:
    detected: int
    struggles: int
    false_stops: int
    false_warnings: int
    beaten: int
    median_us: float
    p95_us: float

    @property
    def passed(self) -> bool:
        return (
            self.detected == self.struggles
            and self.false_stops == 0
            and self.beaten == 0
            and self.median_us < OVERHEAD_BAR_US
        )

    def line(self) -> str:
        return (
            f"detected {self.detected}/{self.struggles} struggles, false severe stops on healthy: {self.false_stops}, "
            f"false warnings: {self.false_warnings}, rows where a baseline beat us: {self.beaten}, "
            f"guard overhead per tool call: median {self.median_us:.1f} µs, p95 {self.p95_us:.1f} µs "
            f"(bar < {OVERHEAD_BAR_US:g} µs)"
        )


def summarise(rows: Sequence[Row]) -> Summary:
    struggles = [r for r in rows if not r.trajectory.healthy]
    median, p95 = overhead_us(rows)
    return Summary(
        detected=sum(1 for r in struggles if r.detection(OURS) is not None),
        struggles=len(struggles),
        false_stops=sum(1 for r in rows if r.false_stop),
        false_warnings=sum(r.false_warnings for r in rows),
        beaten=sum(1 for r in rows if r.beaten),
        median_us=median,
        p95_us=p95,
    )


def main() -> int:
    rows = run_library()
    summary = summarise(rows)
    print(table(rows))
    print()
    print("⚠ warning, ✖ severe, tN: turn of first detection; Δ: turns and tokens from onset to detection.")
    print("runaway rows use the real client's detector: orchestrator.runaway.check_runaway on a response_draft.Draft.")
    print(summary.line())
    unfinished = [r.trajectory.name for r in rows if r.verdict() == "DID NOT FINISH"]
    if unfinished:
        print(f"healthy runs that did not submit: {', '.join(unfinished)}")
    return 0 if summary.passed and not unfinished else 1


if __name__ == "__main__":
    sys.exit(main())
