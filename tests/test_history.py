"""history.fitted: what a request carries of a long history in a small window."""

from __future__ import annotations

import json
import random

from orchestrator.history import KEPT_OUTPUT_SHARE, LEFT_OUT, fitted

WINDOW = 4096
ROOM = int(WINDOW * KEPT_OUTPUT_SHARE * 3)
CAP = 1843  # the tools' output cap for a 4096-token window


def history(sizes: list[int]) -> list[dict]:
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    for i, size in enumerate(sizes):
        arguments = json.dumps({"path": f"f{i}.py"})
        messages.append({"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "read_file", "arguments": arguments}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "x" * size})
    return messages


def left_out(request: list[dict]) -> set[int]:
    return {i for i, m in enumerate(request) if str(m.get("content", "")).startswith("[") and "left out" in m["content"]}


def test_an_output_left_out_never_comes_back_in_a_later_request() -> None:
    """Greedy from the newest, a small old output skipped once came back when a large newer one went."""
    sizes = [1843, 200, 1843, 20, 200, 1843, 1843, 200, 900, 200]
    before: set[int] = set()
    for turn in range(1, len(sizes) + 1):
        now = left_out(fitted(history(sizes[:turn]), WINDOW))
        assert before <= now, f"turn {turn}: {sorted(before - now)} back"
        before = now


def test_most_turns_extend_the_last_request_instead_of_rewriting_it() -> None:
    """A server's prompt cache reuses the request's unchanged beginning: a request that rewrites an earlier
    message at most turns (19 of 29 here) has it read again from there each time."""
    rng = random.Random(2)
    sizes: list[int] = []
    previous = None
    rewrites = 0
    for _ in range(30):  # max_turns
        sizes.append(rng.choice([30, 300, 900, CAP]))
        request = fitted(history(sizes), WINDOW)
        if previous is not None and request[: len(previous)] != previous:
            rewrites += 1
        previous = request
    assert rewrites <= 10, rewrites


def test_the_lines_standing_for_outputs_count_too() -> None:
    """Thirty reads: uncounted, the lines (135 chars each) took another 3500 chars beside the 40%."""
    request = fitted(history([900] * 30), WINDOW)
    carried = sum(len(m["content"]) for m in request[2:] if m["role"] == "tool")
    assert carried <= ROOM, carried


def test_an_output_shorter_than_the_line_stays() -> None:
    request = fitted(history([CAP, 12, CAP, CAP, CAP]), WINDOW)
    assert request[5]["content"] == "x" * 12 and request[3]["content"] == LEFT_OUT


def test_the_task_and_the_newest_two_are_never_left_out() -> None:
    request = fitted(history([CAP] * 12), WINDOW)
    assert request[1]["content"] == "task" and request[-1]["content"] == "x" * CAP and request[-3]["content"] == "x" * CAP
