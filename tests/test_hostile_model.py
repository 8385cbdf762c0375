"""The agent loop against random hostile model output: whatever the model writes, an iteration
ends by a guard (QualityError) or by finishing, never by an exception of ours.

Each trial plays random replies (unknown and odd tool names, arguments of every JSON type, broken
and deeply nested JSON, NUL characters, half surrogate pairs, huge strings, paths out of the
project, into .git, through a symlink loop or into a named pipe, a backtracking regex) through the
real loop, guards, tools, transcript and run store. On the code before this test existed, 60
trials found 33 such exceptions (RecursionError, UnicodeEncodeError, ValueError).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
import structlog

from guards import default_guards
from orchestrator.agent import RunContext, run_agent
from orchestrator.config import GuardsConfig
from orchestrator.errors import QualityError
from orchestrator.iteration_recorder import IterationRecorder
from orchestrator.records import RawToolCall
from orchestrator.scripted import Reply, ScriptedModel
from orchestrator.tool_names import ALL_TOOLS
from orchestrator.tools import Toolbox
from orchestrator.transcript import Transcript
from runs.store import RunStore

NAMES = [*ALL_TOOLS, "", "bash", "READ_FILE", "write_file ", "x" * 300, "a\0b", "run_check\n"]
PATHS = ["a.py", "../x", "/etc/passwd", "a\0b", ".git/config", "loop/x", "sub/../a.py", "sub/new/deep.txt", "pipe",
         "é/ü.txt", "\ud83d.txt", "", " ", "~/x", "a" * 5000, "big.bin"]
PARAMETERS = {"read_file": ["path"], "write_file": ["path", "content"], "edit_file": ["path", "old", "new"],
              "list_dir": ["path"], "search": ["pattern", "path"], "run_command": ["command"], "submit": ["summary"]}


class _Hostile:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def text(self) -> str:
        rng = self.rng
        roll = rng.random()
        if roll < 0.3:
            return rng.choice(PATHS)
        if roll < 0.5:
            return "".join(rng.choice('abc{}[]"\\:,\n\t \x00\ud83d\ude00é') for _ in range(rng.randint(0, 40)))
        if roll < 0.6:
            return "x" * rng.randint(1000, 30000)
        return rng.choice(["print(1)\n", "(a+)+$", "def f():\n    return 1\n", "\\ud83d", ""])

    def value(self, depth: int = 0) -> Any:
        roll = self.rng.random()
        if depth > 3 or roll < 0.5:
            return self.text()
        if roll < 0.6:
            return self.rng.choice([0, -1, 10**30, 1.5, True, None])
        if roll < 0.8:
            return [self.value(depth + 1) for _ in range(self.rng.randint(0, 3))]
        return {self.text()[:10]: self.value(depth + 1) for _ in range(self.rng.randint(0, 3))}

    def arguments(self) -> str:
        roll = self.rng.random()
        if roll < 0.5:
            return json.dumps({key: self.text() for key in PARAMETERS.get(self.rng.choice(ALL_TOOLS), ["path"])})
        if roll < 0.7:
            return json.dumps(self.value())
        if roll < 0.8:
            return "[" * self.rng.randint(1, 3000)
        if roll < 0.9:
            return json.dumps({"path": self.text()})[: self.rng.randint(0, 20)]
        return self.text()

    def reply(self) -> Reply:
        rng = self.rng
        roll = rng.random()
        if roll < 0.6:
            calls = tuple(
                RawToolCall(name=rng.choice(NAMES), arguments=self.arguments(), id=rng.choice(["", "c1", "c1", str(rng.random())]))
                for _ in range(rng.randint(1, 3))
            )
            return Reply(text=self.text() if rng.random() < 0.3 else "", tool_calls=calls,
                         finish_reason=rng.choice(["", "tool_calls", "length", "stop"]))
        if roll < 0.8:
            body = self.arguments()
            return Reply(text=f"<tool_call>{body}</tool_call>" if rng.random() < 0.5 else f"```json\n{body}\n```")
        return Reply(text=self.text(), finish_reason=rng.choice(["", "stop", "length"]))


@pytest.mark.parametrize("seed", range(5))
def test_hostile_output_ends_by_a_guard_or_by_finishing(tmp_path: Path, seed: int) -> None:
    hostile = _Hostile(seed)
    quiet = structlog.wrap_logger(structlog.PrintLogger(open(os.devnull, "w")))
    store = RunStore.open(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        run_id = store.begin_run(config_path="c", pid=1, host="h")
        for trial in range(40):
            root = tmp_path / f"work{trial}"
            (root / "sub").mkdir(parents=True)
            (root / "a.py").write_text("A = 1\n")
            (root / "big.bin").write_bytes(b"\0" * 100)
            (root / "loop").symlink_to("loop")
            os.mkfifo(root / "pipe")
            toolbox = Toolbox(root, ALL_TOOLS, check_command="true", check_timeout_s=10, command_timeout_s=5)
            task_id = store.begin_task(run_id, name=f"t{trial}", branch="b")
            iteration_id = store.begin_iteration(task_id, number=1, checkpoint="x", pid=1)
            transcript_path = tmp_path / f"t{trial}.jsonl"
            with Transcript(transcript_path) as transcript:
                recorder = IterationRecorder(store, iteration_id, transcript, quiet)
                ctx = RunContext(max_turns=hostile.rng.randint(3, 25), tool_names=toolbox.names(),
                                 sink=lambda signal: recorder.signal(signal, lambda _: None), context_window=8192)
                model = ScriptedModel([hostile.reply() for _ in range(40)])
                try:
                    run_agent(model, toolbox, default_guards(GuardsConfig()), [{"role": "user", "content": "go"}], ctx, recorder)
                except QualityError:
                    pass
            store.finish_iteration(iteration_id, outcome="rolled_back", reason="fuzz")
            for line in transcript_path.read_text(encoding="utf-8").splitlines():
                json.loads(line)
        assert len(store.run(run_id).tasks) == 40
    finally:
        store.close()
