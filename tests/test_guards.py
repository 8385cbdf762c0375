"""The guard suite: each guard's hooks on a real RunContext, then whole agent runs."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from guards import (
    BrokenCallGuard,
    ContextGuard,
    DeadLoopGuard,
    EmptyResponseGuard,
    FailingStreakGuard,
    RepeatedCallGuard,
    UnknownToolGuard,
    UnusableAnswersGuard,
    build_guards,
    default_guards,
    load_guard,
    user_guards,
)
from orchestrator.agent import RunContext, run_agent
from orchestrator.config import GuardsConfig
from orchestrator.errors import ConfigError, QualityError
from orchestrator.records import BrokenCall, Level, ModelResponse, RawToolCall, Signal, ToolCall, ToolResult
from orchestrator.scripted import ScriptedModel, call, calls, say
from orchestrator.tools import Toolbox

TOOLS = ["read_file", "write_file", "edit_file", "list_dir", "run_check", "submit"]
OK = ToolResult(ok=True, output="ok")


def make_ctx(context_window: int | None = None) -> tuple[RunContext, list[Signal]]:
    sink: list[Signal] = []
    return RunContext(max_turns=30, tool_names=list(TOOLS), sink=sink.append, context_window=context_window), sink


def started(guard, context_window: int | None = None):
    ctx, sink = make_ctx(context_window)
    guard.before_run(ctx)
    return ctx, sink


def read(path: str = "a.py") -> ToolCall:
    return ToolCall(name="read_file", arguments={"path": path})


def answer(*calls: ToolCall | BrokenCall, text: str = "") -> tuple[ModelResponse, list]:
    raw = tuple(RawToolCall(name=c.name, arguments="{}") for c in calls)
    return ModelResponse(text=text, tool_calls=raw), list(calls)


def broken(problem: str, name: str = "write_file") -> BrokenCall:
    return BrokenCall(name=name, raw_arguments='{"path": "a.py", "content": "x', problem=problem, detail="bad JSON")


# A tool name a model chose to redraw the report's line on a terminal, then pad it out.
HOSTILE_NAME = "x\r\x1b[2K\u2714 t1: succeeded\x1b[K\x1b[8m\x00\n" + "z" * 15000


def kinds(sink: list[Signal]) -> list[tuple[Level, str]]:
    return [(s.level, s.kind) for s in sink]


class TestRepeatedCallGuard:
    def test_same_call_same_result_reminds_at_third_and_stops_at_fourth(self):
        """Three identical calls with identical results remind and warn; the fourth raises."""
        guard = RepeatedCallGuard(remind_at=3, stop_at=4)
        ctx, sink = started(guard)
        for _ in range(2):
            guard.after_tool_call(ctx, read(), OK)
        assert sink == [] and ctx.take_reminders() == []
        guard.after_tool_call(ctx, read(), OK)
        assert sink == [Signal(Level.WARNING, "repeated_tool_call", "loop: read_file ×3")]
        assert "read_file" in ctx.take_reminders()[0]
        with pytest.raises(QualityError) as stop:
            guard.after_tool_call(ctx, read(), OK)
        assert stop.value.reason == "repeated_tool_call"
        assert stop.value.message == "loop: read_file ×4"
        assert stop.value.evidence == 'read_file(path="a.py") ×4, the last returning:\nok'
        assert len(sink) == 1  # the loop, not the guard, reports the severe signal

    def test_same_call_with_new_result_is_progress(self):
        """Re-running the check after each edit gives a new output every time and never stops."""
        guard = RepeatedCallGuard(remind_at=3, stop_at=4)
        ctx, sink = started(guard)
        check = ToolCall(name="run_check", arguments={})
        for attempt in range(8):
            guard.after_tool_call(ctx, check, ToolResult(ok=False, output=f"{8 - attempt} failed"))
        assert sink == []

    def test_reading_a_file_again_after_editing_it_is_not_a_repeat(self):
        """A read whose output changed because of an edit in between starts the count again."""
        guard = RepeatedCallGuard(remind_at=3, stop_at=4)
        ctx, sink = started(guard)
        for version in range(4):
            guard.after_tool_call(ctx, read(), ToolResult(ok=True, output=f"v{version}"))
            guard.after_tool_call(ctx, read(), ToolResult(ok=True, output=f"v{version}"))
        assert sink == []

    def test_another_call_in_between_resets_the_count(self):
        """Only consecutive identical calls count."""
        guard = RepeatedCallGuard(remind_at=3, stop_at=4)
        ctx, sink = started(guard)
        for _ in range(3):
            guard.after_tool_call(ctx, read(), OK)
            guard.after_tool_call(ctx, read("b.py"), OK)
        assert sink == []

    def test_the_stop_tells_the_next_attempt_to_change_something_first(self):
        """The notes.md correction is for the next attempt (never "do not call it again"); the evidence shows the result."""
        guard = RepeatedCallGuard(remind_at=3, stop_at=4)
        ctx, _ = started(guard)
        check = ToolCall(name="run_check", arguments={})
        failed = ToolResult(ok=False, output="the check failed: exit code 1\nFAILED test_greet: got 'helo'\n" + "x\n" * 50)
        with pytest.raises(QualityError) as stop:
            for _ in range(4):
                guard.after_tool_call(ctx, check, failed)
        assert "Do not call it again" not in stop.value.correction
        assert stop.value.correction.startswith("Last time you made the call run_check() 4 times in a row without changing")
        assert "FAILED test_greet: got 'helo'" in stop.value.evidence
        assert len(stop.value.evidence.splitlines()) <= 6
        reminder = ctx.take_reminders()[0]
        assert "Do not call it again" in reminder  # the in-run reminder is unchanged
        assert "run the check" not in reminder  # to a model that ran it four times, that read as the way on

    def test_copies_of_one_call_in_one_answer_count_once(self):
        """Four identical reads in one answer are one repeat; the same read in the next two answers reminds at the third."""
        guard = RepeatedCallGuard(remind_at=3, stop_at=4)
        ctx, sink = started(guard)
        play_round(guard, ctx, *[(read(), OK)] * 4)
        assert sink == []
        play_round(guard, ctx, (read(), OK))
        play_round(guard, ctx, (read(), OK), (read(), OK))
        assert [s.message for s in sink] == ["loop: read_file ×3"]

    def test_the_varied_arguments_reminder_does_not_claim_one_call(self):
        """Three different files with the same header warn as varied arguments, without "3 times in a row"."""
        guard = RepeatedCallGuard(remind_at=3, stop_at=4)
        ctx, sink = started(guard)
        header = ToolResult(ok=True, output="# Copyright 2024 Example Corp. Licensed under the Apache License 2.0.\n")
        for package in "abc":
            guard.after_tool_call(ctx, read(f"pkg_{package}/__init__.py"), header)
        assert [s.message for s in sink] == ["loop: read_file ×3 (varied arguments)"]
        reminder = ctx.take_reminders()[0]
        assert "times in a row" not in reminder and "pkg_c" not in reminder
        assert "3 calls to read_file" in reminder

    def test_a_varied_arguments_streak_warns_once_and_never_stops(self):
        """Six different files with the same header: one warning at the third, none after, and no stop."""
        guard = RepeatedCallGuard(remind_at=3, stop_at=4)
        ctx, sink = started(guard)
        header = ToolResult(ok=True, output="# Copyright 2024 Example Corp. Licensed under the Apache License 2.0.\n")
        for package in "abcdef":
            guard.after_tool_call(ctx, read(f"pkg_{package}/__init__.py"), header)
        assert [s.message for s in sink] == ["loop: read_file ×3 (varied arguments)"]

    def test_before_run_resets(self):
        """A guard reused for a second run starts counting from zero."""
        guard = RepeatedCallGuard(remind_at=3, stop_at=4)
        ctx, _ = started(guard)
        for _ in range(3):
            guard.after_tool_call(ctx, read(), OK)
        ctx, sink = started(guard)
        for _ in range(2):
            guard.after_tool_call(ctx, read(), OK)
        assert sink == []


class TestVolatileResults:
    """Results that differ only in a duration, a timestamp, an address or pytest's tmp folder are the same."""

    PYTEST = "F\n___ test_greet ___\n{where}\nE   assert 'helo' == 'hello'\n1 failed in {took}s"

    def test_a_rerun_pytest_differing_only_in_timing_is_a_repeat(self):
        """Runs of a failing pytest whose times, addresses and tmp folders differ remind from the third, stop at the sixth."""
        guard = RepeatedCallGuard(remind_at=3, stop_at=4)
        ctx, sink = started(guard)
        check = ToolCall(name="run_check", arguments={})
        runs = [
            self.PYTEST.format(where=f"/tmp/pytest-of-bob/pytest-{n}/x <object at 0x7f3a2b1c9d{n}0>", took=f"0.0{n}")
            for n in range(2, 8)
        ]
        for output in runs[:5]:
            guard.after_tool_call(ctx, check, ToolResult(ok=False, output=output))
        assert kinds(sink) == [(Level.WARNING, "repeated_tool_call")] * 3
        with pytest.raises(QualityError):
            guard.after_tool_call(ctx, check, ToolResult(ok=False, output=runs[5]))

    def test_a_poll_whose_elapsed_time_advances_is_not_stopped_at_the_fourth(self):
        """Equal only without the elapsed time: reminders at the 3rd and 4th look, no stop; the 5th look says done."""
        guard = RepeatedCallGuard(remind_at=3, stop_at=4)
        ctx, sink = started(guard)
        poll = ToolCall(name="run_command", arguments={"command": "python poll.py"})
        for n in range(1, 5):
            guard.after_tool_call(ctx, poll, ToolResult(ok=True, output=f"deps: still installing, {n * 2.5:.1f}s elapsed"))
        guard.after_tool_call(ctx, poll, ToolResult(ok=True, output="deps: done"))
        assert [s.message for s in sink] == ["loop: run_command ×3", "loop: run_command ×4"]

    def test_exact_repeats_after_a_volatile_change_stop_at_the_fourth_exact(self):
        """An exactly equal result stops at stop_at counted from where the results became exactly equal."""
        guard = RepeatedCallGuard(remind_at=3, stop_at=4)
        ctx, sink = started(guard)
        check = ToolCall(name="run_check", arguments={})
        guard.after_tool_call(ctx, check, ToolResult(ok=False, output="1 failed in 0.01s"))
        for _ in range(3):
            guard.after_tool_call(ctx, check, ToolResult(ok=False, output="1 failed in 0.02s"))
        with pytest.raises(QualityError):
            guard.after_tool_call(ctx, check, ToolResult(ok=False, output="1 failed in 0.02s"))

    def test_short_hex_values_are_not_addresses(self):
        """0x… with fewer than 8 hex digits is a value (a flag, an error code), compared exactly."""
        from guards._normalise import same_output

        assert not same_output("status 0x1f2e3d", "status 0x1f2e3e")
        assert same_output("<object at 0x7f3a2b1c>", "<object at 0x7f3a2b1d>")

    def test_timestamps_and_durations_are_set_aside(self):
        """ISO timestamps, `took 1.2s` and `0.03 seconds` are volatile; counts and versions are not."""
        from guards._normalise import same_output

        assert same_output("built at 2026-11-30T19:14:48.199876Z", "built at 2026-11-30T19:15:02Z")
        assert same_output("took 1.2s (0.03 seconds idle)", "took 0.9s (0.41 seconds idle)")
        assert not same_output("1 failed in 0.02s", "2 failed in 0.02s")
        assert not same_output("3 passed", "4 passed")
        assert not same_output("version 1.2", "version 1.3")
        assert not same_output("sleep 3s", "sleep 5s")

    def test_a_file_read_again_is_compared_exactly(self):
        """Only commands' output is volatile: a file whose timeout changed from 0.5s to 1.5s was really edited."""
        from guards._normalise import same_result

        assert same_result("run_check", "1 failed in 0.5s", "1 failed in 1.5s")
        assert not same_result("read_file", "TIMEOUT = '0.5s'", "TIMEOUT = '1.5s'")

    def test_dead_loop_sees_no_progress_in_a_timing_change(self):
        """Circling between a read and a pytest run whose timing changes is still a dead loop."""
        guard = DeadLoopGuard(window=6, recent=4, distinct=2)
        ctx, sink = started(guard)
        check = ToolCall(name="run_check", arguments={})
        for took in ("0.02", "0.03"):
            play_round(guard, ctx, (read(), OK))
            play_round(guard, ctx, (check, ToolResult(ok=False, output=f"1 failed in {took}s")))
        assert kinds(sink) == [(Level.WARNING, "dead_loop")]


class TestCallNoise:
    def test_a_trailing_newline_is_noise_in_a_one_line_value(self):
        """`cat notes.txt\\n` is `cat notes.txt`, and `a.py\\n` is `a.py`; real multi-line text stays exact."""
        from guards._normalise import call_key

        def key(**arguments):
            return call_key(ToolCall(name="run_command", arguments=arguments))

        assert key(command="cat notes.txt\n") == key(command="cat notes.txt")
        assert key(path="./a.py\n") == key(path="a.py")
        assert key(content="a\n  b\n") != key(content="a\n b\n")

    def test_an_optional_argument_at_its_default_is_the_call_without_it(self):
        """`read_file` with `start_line: 1` and without it, `list_dir` of "./" and of nothing: one call each.
        A model alternating them made two calls to repeated_tool_call, which never stopped it."""
        from guards._normalise import call_key

        def key(name, **arguments):
            return call_key(ToolCall(name=name, arguments=arguments))

        assert key("read_file", path="a.py", start_line=1) == key("read_file", path="a.py")
        assert key("read_file", path="a.py", start_line=2) != key("read_file", path="a.py")
        assert key("read_file", path="a.py", start_line=True) != key("read_file", path="a.py")
        assert key("list_dir", path="./") == key("list_dir") == key("list_dir", path=".")
        assert key("search", pattern="x", path=".") == key("search", pattern="x")
        assert key("run_command", command="ls", path=".") != key("run_command", command="ls")

    def test_the_alternating_read_now_stops_as_a_repeat(self):
        guard = RepeatedCallGuard(remind_at=3, stop_at=4)
        ctx, _ = started(guard)
        with pytest.raises(QualityError):
            for turn in range(4):
                arguments = {"path": "a.py", "start_line": 1} if turn % 2 else {"path": "a.py"}
                guard.after_tool_call(ctx, ToolCall(name="read_file", arguments=arguments), OK)


class TestEmptyResponseGuard:
    def test_first_empty_nudges_second_stops(self):
        """One empty answer is nudged and warned; the second in a row raises empty_response."""
        guard = EmptyResponseGuard(stop_at=2)
        ctx, sink = started(guard)
        guard.after_model_response(ctx, ModelResponse(text="  \n"), [])
        assert sink == [Signal(Level.WARNING, "empty_response", "empty response")]
        assert ctx.take_reminders() != []
        with pytest.raises(QualityError) as stop:
            guard.after_model_response(ctx, ModelResponse(text=""), [])
        assert stop.value.reason == "empty_response"
        assert stop.value.message == "empty response ×2"

    def test_a_thinking_model_cut_off_at_the_token_limit_is_told_so(self):
        """Reasoning cut off by finish_reason=length: the nudge asks for brief thinking; the stop names max_tokens."""
        guard = EmptyResponseGuard(stop_at=2)
        ctx, sink = started(guard)
        cut = ModelResponse(text="", reasoning="Hmm, let me think. " * 200, finish_reason="length", completion_tokens=2048)
        guard.after_model_response(ctx, cut, [])
        assert "Think briefly" in ctx.take_reminders()[0]
        with pytest.raises(QualityError) as stop:
            guard.after_model_response(ctx, cut, [])
        assert stop.value.reason == "empty_response"
        assert "[model] max_tokens" in stop.value.correction and "Never answer with an empty" not in stop.value.correction
        assert "cut off at the token limit" in stop.value.evidence and "2048" in stop.value.evidence
        assert sink[0].message == "empty response (cut off while thinking)"

    def test_an_answer_cut_off_without_reasoning_is_not_said_to_be_thinking(self):
        """finish_reason=length with no reasoning at all: the plain nudge and correction, no blame on thinking."""
        guard = EmptyResponseGuard(stop_at=2)
        ctx, sink = started(guard)
        cut = ModelResponse(text="", finish_reason="length", completion_tokens=16)
        guard.after_model_response(ctx, cut, [])
        assert "Your last answer was empty" in ctx.take_reminders()[0]
        with pytest.raises(QualityError) as stop:
            guard.after_model_response(ctx, cut, [])
        assert sink[0].message == "empty response"
        assert "Never answer with an empty" in stop.value.correction and "max_tokens" not in stop.value.correction

    def test_an_answer_in_between_resets(self):
        """Text or a call between two empty answers means neither is the second in a row."""
        guard = EmptyResponseGuard(stop_at=2)
        ctx, sink = started(guard)
        for response, parsed in [
            (ModelResponse(text=""), []),
            (ModelResponse(text="thinking"), []),
            (ModelResponse(text=""), []),
            answer(read()),
            (ModelResponse(text=""), []),
        ]:
            guard.after_model_response(ctx, response, parsed)
        assert [s.kind for s in sink] == ["empty_response"] * 3


class TestUnknownToolGuard:
    def test_unknown_tool_twice_stops(self):
        """A missing tool warns once, then a second answer in a row with one raises unknown_tool."""
        guard = UnknownToolGuard(stop_at=2)
        ctx, sink = started(guard)
        guard.after_model_response(ctx, *answer(broken("unknown_tool", name="foo")))
        assert sink == [Signal(Level.WARNING, "unknown_tool", "unknown tool: foo")]
        with pytest.raises(QualityError) as stop:
            guard.after_model_response(ctx, *answer(broken("unknown_tool", name="foo")))
        assert stop.value.reason == "unknown_tool"
        assert "read_file" in stop.value.correction

    def test_an_answer_with_a_usable_call_beside_the_unknown_one_only_warns(self):
        """`run_check` beside a made-up `think`, answer after answer: the usable calls run and are
        progress; stopping at the second rolled back a fix whose check had passed."""
        guard = UnknownToolGuard(stop_at=2)
        ctx, sink = started(guard)
        for _ in range(3):
            guard.after_model_response(ctx, *answer(read(), broken("unknown_tool", name="think")))
        guard.after_model_response(ctx, *answer(broken("unknown_tool", name="think")))  # the first in a row without one
        assert [(s.level, s.message) for s in sink] == [(Level.WARNING, "unknown tool: think")] * 4

    def test_an_answer_with_a_usable_call_beside_starts_the_count_again(self):
        """A made-up tool alone, then beside a usable call, then alone again: the count started again, no stop."""
        guard = UnknownToolGuard(stop_at=2)
        ctx, sink = started(guard)
        guard.after_model_response(ctx, *answer(broken("unknown_tool", name="think")))
        guard.after_model_response(ctx, *answer(read(), broken("unknown_tool", name="think")))
        guard.after_model_response(ctx, *answer(broken("unknown_tool", name="think")))
        assert [(s.level, s.message) for s in sink] == [(Level.WARNING, "unknown tool: think")] * 3

    def test_empty_tool_name_uses_its_own_kind(self):
        """A call without a name is reported and stopped as empty_tool_name."""
        guard = UnknownToolGuard(stop_at=2)
        ctx, sink = started(guard)
        guard.after_model_response(ctx, *answer(broken("empty_tool_name", name="")))
        with pytest.raises(QualityError) as stop:
            guard.after_model_response(ctx, *answer(broken("empty_tool_name", name="")))
        assert kinds(sink) == [(Level.WARNING, "empty_tool_name")]
        assert stop.value.reason == "empty_tool_name"

    def test_a_clean_answer_resets(self):
        """An answer without a missing tool in between means no stop."""
        guard = UnknownToolGuard(stop_at=2)
        ctx, sink = started(guard)
        guard.after_model_response(ctx, *answer(broken("unknown_tool", name="foo")))
        guard.after_model_response(ctx, *answer(read()))
        guard.after_model_response(ctx, *answer(broken("unknown_tool", name="foo")))
        assert len(sink) == 2

    def test_a_made_up_name_is_quoted_escaped_and_cut(self):
        """A name holding \\r, terminal escapes and 15,000 characters reaches no message, correction or evidence raw."""
        guard = UnknownToolGuard(stop_at=2)
        ctx, sink = started(guard)
        guard.after_model_response(ctx, *answer(broken("unknown_tool", name=HOSTILE_NAME)))
        with pytest.raises(QualityError) as stop:
            guard.after_model_response(ctx, *answer(broken("unknown_tool", name=HOSTILE_NAME)))
        assert sink[0].message.startswith("unknown tool: 'x\\r\\x1b[2K✔ t1: succeeded")
        for text in (sink[0].message, stop.value.message, stop.value.correction, stop.value.evidence):
            assert text.isprintable() and len(text) < 400, text[:500]

    def test_broken_arguments_are_not_its_business(self):
        """Unparseable arguments to a real tool are left to the broken-call guard."""
        guard = UnknownToolGuard(stop_at=1)
        ctx, sink = started(guard)
        guard.after_model_response(ctx, *answer(broken("unparseable")))
        assert sink == []


class TestBrokenCallGuard:
    def test_a_made_up_name_and_parameter_are_escaped_and_cut(self):
        """A call written in text names what it likes, and its detail may quote a parameter of any length."""
        guard = BrokenCallGuard(stop_at=2)
        ctx, sink = started(guard)
        call = BrokenCall(
            name=HOSTILE_NAME, raw_arguments='{"\x1b[8m": 1}', problem="invalid", detail=f"unknown parameter {HOSTILE_NAME!r}"
        )
        guard.after_model_response(ctx, *answer(call))
        with pytest.raises(QualityError) as stop:
            guard.after_model_response(ctx, *answer(call))
        for text in (sink[0].message, stop.value.message, stop.value.correction, stop.value.evidence):
            assert text.isprintable() and len(text) < 600, text[:700]

    def test_three_broken_answers_stop(self):
        """Unparseable or invalid arguments warn each time and the third answer in a row raises."""
        guard = BrokenCallGuard(stop_at=3)
        ctx, sink = started(guard)
        guard.after_model_response(ctx, *answer(broken("unparseable")))
        guard.after_model_response(ctx, *answer(broken("invalid")))
        with pytest.raises(QualityError) as stop:
            guard.after_model_response(ctx, *answer(broken("unparseable")))
        assert [s.message for s in sink] == ["broken call: write_file", "broken call: write_file ×2"]
        assert stop.value.reason == "broken_tool_call"
        assert stop.value.message == "broken call: write_file ×3"

    def test_a_good_call_resets(self):
        """An answer with a usable call starts the count again."""
        guard = BrokenCallGuard(stop_at=3)
        ctx, sink = started(guard)
        for _ in range(3):
            guard.after_model_response(ctx, *answer(broken("unparseable")))
            guard.after_model_response(ctx, *answer(broken("invalid")))
            guard.after_model_response(ctx, *answer(read()))
        assert len(sink) == 6 and all(s.level is Level.WARNING for s in sink)

    def test_an_answer_with_a_usable_call_beside_the_broken_one_only_warns(self):
        """A burst whose last call was cut off, answer after answer: its good calls run and are progress;
        the third such answer stopped the run before they did."""
        guard = BrokenCallGuard(stop_at=3)
        ctx, sink = started(guard)
        for _ in range(4):
            guard.after_model_response(ctx, *answer(read(), broken("unparseable")))
        guard.after_model_response(ctx, *answer(broken("unparseable")))
        guard.after_model_response(ctx, *answer(broken("unparseable")))
        with pytest.raises(QualityError):
            guard.after_model_response(ctx, *answer(broken("unparseable")))
        assert [s.message for s in sink] == ["broken call: write_file"] * 5 + ["broken call: write_file ×2"]

    def test_prose_in_between_does_not_reset(self):
        """Text without any call between broken calls still counts towards the stop."""
        guard = BrokenCallGuard(stop_at=2)
        ctx, _ = started(guard)
        guard.after_model_response(ctx, *answer(broken("unparseable")))
        guard.after_model_response(ctx, *answer(text="Let me try again."))
        with pytest.raises(QualityError):
            guard.after_model_response(ctx, *answer(broken("unparseable")))


class TestUnusableAnswersGuard:
    def test_answers_unusable_in_turn_different_ways_stop_at_the_third(self):
        """Prose, an empty answer and a made-up tool in a row stop at the third, as the last one's kind."""
        guard = UnusableAnswersGuard(stop_at=3)
        ctx, sink = started(guard)
        guard.after_model_response(ctx, ModelResponse(text="I will read greet.py."), [])
        guard.after_model_response(ctx, ModelResponse(text=""), [])
        with pytest.raises(QualityError) as stop:
            guard.after_model_response(ctx, *answer(broken("unknown_tool", name="bash")))
        assert stop.value.reason == "unknown_tool"
        assert stop.value.message == "no usable call ×3"
        assert "an empty answer" in stop.value.evidence and "bash" in stop.value.evidence
        assert "read_file" in stop.value.correction
        assert sink == []

    def test_answers_of_one_kind_are_left_to_their_own_guard(self):
        """Five broken answers in a row are the broken-call guard's to stop, at its own threshold."""
        guard = UnusableAnswersGuard(stop_at=3)
        ctx, _ = started(guard)
        for _ in range(5):
            guard.after_model_response(ctx, *answer(broken("unparseable")))

    def test_only_a_usable_call_resets(self):
        """An answer with a good call, even beside a broken one, starts the count again."""
        guard = UnusableAnswersGuard(stop_at=3)
        ctx, _ = started(guard)
        for _ in range(3):
            guard.after_model_response(ctx, ModelResponse(text="hmm"), [])
            guard.after_model_response(ctx, ModelResponse(text=""), [])
            guard.after_model_response(ctx, *answer(broken("unparseable"), read()))


class TestFailingStreakGuard:
    def test_warns_from_the_third_failure_and_never_stops_by_default(self):
        """Issue 4's contract: a failing streak is a warning from the 3rd failure in a row, the run goes on."""
        guard = FailingStreakGuard(at=3)
        ctx, sink = started(guard)
        for index in range(12):
            guard.after_tool_call(ctx, read(f"guess{index}.py"), ToolResult(ok=False, output="not found"))
        assert [s.message for s in sink] == [f"failing: {n} tool calls in a row" for n in range(3, 13)]
        assert {s.level for s in sink} == {Level.WARNING}

    def test_with_a_stop_configured_it_warns_from_the_third_and_stops_there(self):
        """`failing_streak_stop_at = 6`: different failing calls warn from the third on, with the count, and the sixth raises."""
        guard = FailingStreakGuard(at=3, stop_at=6)
        ctx, sink = started(guard)
        for index in range(5):
            guard.after_tool_call(ctx, read(f"guess{index}.py"), ToolResult(ok=False, output="not found"))
        assert [s.message for s in sink] == [f"failing: {n} tool calls in a row" for n in range(3, 6)]
        assert {s.kind for s in sink} == {"failing_streak"}
        assert "list_dir" in ctx.take_reminders()[0]
        with pytest.raises(QualityError) as stop:
            guard.after_tool_call(ctx, read("guess5.py"), ToolResult(ok=False, output="not found\nsecond line"))
        assert stop.value.reason == "failing_streak"
        assert stop.value.evidence == 'read_file(path="guess5.py") failed:\nnot found\nsecond line'

    def test_a_success_with_something_new_resets(self):
        """A successful call that returns something not seen before breaks the streak."""
        guard = FailingStreakGuard(at=3)
        ctx, sink = started(guard)
        for index in range(3):
            guard.after_tool_call(ctx, read("x"), ToolResult(ok=False, output="no"))
            guard.after_tool_call(ctx, read("y"), ToolResult(ok=False, output="no"))
            guard.after_tool_call(ctx, read(f"a{index}.py"), OK)
        assert sink == []

    def test_rereading_the_same_file_between_failed_edits_is_no_reset(self):
        """Read, failed edit (another `old` each time), read again: the third failed edit warns."""
        guard = FailingStreakGuard(at=3)
        ctx, sink = started(guard)
        text = ToolResult(ok=True, output="def greet():\n    return 'helo'\n")
        for old in ("'hi'", "'Helo'", "retrun"):
            guard.after_tool_call(ctx, read("greet.py"), text)
            edit = ToolCall(name="edit_file", arguments={"path": "greet.py", "old": old, "new": "'hello'"})
            guard.after_tool_call(ctx, edit, ToolResult(ok=False, output="`old` was not found in greet.py"))
        assert kinds(sink) == [(Level.WARNING, "failing_streak")]
        assert sink[0].message == "failing: 3 failed calls, nothing new in between"


    def test_copies_of_one_failing_call_in_one_answer_count_once(self):
        """Six copies of a failing check in one answer are one failure; three such answers only warn."""
        guard = FailingStreakGuard(at=3)
        ctx, sink = started(guard)
        failed = ToolResult(ok=False, output="the check failed: exit code 1")
        check = ToolCall(name="run_check", arguments={})
        guard.after_model_response(ctx, *answer(*[check] * 6))
        for _ in range(6):
            guard.after_tool_call(ctx, check, failed)
        assert sink == []
        for path in ("x.py", "y.py"):
            guard.after_model_response(ctx, *answer(read(path), read(path)))
            for _ in range(2):
                guard.after_tool_call(ctx, read(path), ToolResult(ok=False, output="not found"))
        assert [s.message for s in sink] == ["failing: 3 tool calls in a row"]

    def test_a_failing_command_with_a_new_output_is_news(self):
        """Probes that fail, each with its own output, never warn; the same failure again (volatile parts aside) counts."""
        guard = FailingStreakGuard(at=3)
        ctx, sink = started(guard)
        for index in range(8):
            probe = ToolCall(name="run_command", arguments={"command": f"python -c 'assert f({index}) == 1'"})
            guard.after_tool_call(ctx, probe, ToolResult(ok=False, output=f"AssertionError: {index}"))
        assert sink == []
        check = ToolCall(name="run_check", arguments={})
        for seconds in ("0.01", "0.02", "0.03"):
            guard.after_tool_call(ctx, check, ToolResult(ok=False, output=f"1 failed in {seconds}s"))
        assert [s.message for s in sink] == ["failing: 3 tool calls in a row"]

    def test_failed_edits_count_even_with_a_new_output(self):
        """Failed edits each with their own message still count: only commands' new failures are news."""
        guard = FailingStreakGuard(at=3, stop_at=6)
        ctx, sink = started(guard)
        for index in range(5):
            edit = ToolCall(name="edit_file", arguments={"path": "a.py", "old": f"x{index}", "new": "y"})
            guard.after_tool_call(ctx, edit, ToolResult(ok=False, output=f"`old` x{index} was not found in a.py"))
        with pytest.raises(QualityError):
            guard.after_tool_call(ctx, read("a.py"), ToolResult(ok=False, output="no such file"))

    def test_no_stop_while_the_check_passes_since_the_last_write(self):
        """After the check passed, failures only warn (a stop would roll the fix back); a successful write ends that."""
        guard = FailingStreakGuard(at=3, stop_at=6)
        ctx, sink = started(guard)
        edit = ToolCall(name="edit_file", arguments={"path": "a.py", "old": "x", "new": "y"})
        guard.after_tool_call(ctx, edit, OK)
        guard.after_tool_call(ctx, ToolCall(name="run_check", arguments={}), ToolResult(ok=True, output="passed"))
        for index in range(8):
            guard.after_tool_call(ctx, read(f"guess{index}.py"), ToolResult(ok=False, output="not found"))
        assert [s.level for s in sink] == [Level.WARNING] * 6
        guard.after_tool_call(ctx, ToolCall(name="edit_file", arguments={"path": "b.py", "old": "x", "new": "y"}), OK)
        for index in range(5):
            guard.after_tool_call(ctx, read(f"other{index}.py"), ToolResult(ok=False, output="not found"))
        with pytest.raises(QualityError):
            guard.after_tool_call(ctx, read("last.py"), ToolResult(ok=False, output="not found"))

class TestFileVersions:
    def test_only_regular_files_inside_the_worktree_are_read(self, tmp_path: Path):
        """A pipe (which would block) and a path outside the worktree are never opened; the call stands in."""
        import os

        from guards._contents import FileVersions

        os.mkfifo(tmp_path / "pipe")
        versions = FileVersions()
        for path in ("pipe", "../outside.py", "/etc/hostname"):
            write = ToolCall(name="write_file", arguments={"path": path, "content": "x"})
            versions.before(tmp_path, [write])
            assert versions.new_after(tmp_path, write) is True
            assert versions.new_after(tmp_path, write) is False

    def test_an_edit_of_a_pipe_or_a_device_does_not_read_it(self, tmp_path: Path):
        """edit_file on a pipe or a link to a device: neither is read (a link to /dev/zero would never end);
        the call stands in, so the first such edit is new and the same again is not."""
        import os

        from guards._contents import FileVersions

        os.mkfifo(tmp_path / "pipe")
        (tmp_path / "null").symlink_to("/dev/null")
        versions = FileVersions()
        for path in ("pipe", "null"):
            edit = ToolCall(name="edit_file", arguments={"path": path, "old": "a", "new": "b"})
            versions.before(tmp_path, [edit])
            assert versions.new_after(tmp_path, edit) is True
            assert versions.new_after(tmp_path, edit) is False


    def test_a_path_with_a_nul_is_unreadable_not_a_crash(self, tmp_path: Path):
        """os.stat raises ValueError for a NUL in the path: the call stands in for the content."""
        from guards._contents import FileVersions

        versions = FileVersions()
        write = ToolCall(name="edit_file", arguments={"path": "notes\x00.md", "old": "a", "new": "b"})
        versions.before(tmp_path, [write])
        assert versions.new_after(tmp_path, write) is True
        assert versions.new_after(tmp_path, write) is False

    def test_a_write_to_a_nul_path_leaves_both_file_guards_in(self, project: Path):
        """A refused write to 'notes\\0.md', then failed edits: failing_streak still warns and stops (no guard_error)."""
        replies = [call("write_file", {"path": "notes\x00.md", "content": "x"})]
        replies += [call("edit_file", {"path": "app.py", "old": f"return 4{i}{i}", "new": "return 42"}) for i in range(8)]
        sink, error, _ = run_with_guards(project, *replies, guards=STREAK_STOPS)
        assert "guard_error" not in {s.kind for s in sink}
        assert error is not None and error.reason == "failing_streak"

def play_round(guard, ctx, *pairs: tuple[ToolCall, ToolResult]) -> None:
    guard.after_model_response(ctx, *answer(*(c for c, _ in pairs)))
    for made, result in pairs:
        guard.after_tool_call(ctx, made, result)


class TestDeadLoopGuard:
    def test_alternating_rounds_warn_then_clear_the_window(self):
        """A,B,A,B rounds warn and remind once; the window is cleared, so the next round is quiet."""
        guard = DeadLoopGuard(window=6, recent=4, distinct=2)
        ctx, sink = started(guard)
        for path in ["a.py", "b.py", "a.py"]:
            play_round(guard, ctx, (read(path), OK))
        assert sink == []
        play_round(guard, ctx, (read("b.py"), OK))
        assert sink == [Signal(Level.WARNING, "dead_loop", "dead loop: 2 calls over 4 rounds")]
        assert ctx.take_reminders() != []
        for path in ["a.py", "b.py", "a.py"]:
            play_round(guard, ctx, (read(path), OK))
        assert len(sink) == 1

    def test_a_write_in_between_is_progress(self):
        """A successful edit between the same reads clears the window; nothing is reported."""
        guard = DeadLoopGuard(window=6, recent=4, distinct=2)
        ctx, sink = started(guard)
        edit = ToolCall(name="edit_file", arguments={"path": "a.py", "old": "x", "new": "y"})
        for _ in range(3):
            play_round(guard, ctx, (read("a.py"), OK))
            play_round(guard, ctx, (read("b.py"), OK))
            play_round(guard, ctx, (edit, OK))
        assert sink == []

    def test_a_failed_write_is_not_progress(self):
        """An edit that failed changed nothing, so the rounds still count as circling."""
        guard = DeadLoopGuard(window=6, recent=4, distinct=2)
        ctx, sink = started(guard)
        edit = ToolCall(name="edit_file", arguments={"path": "a.py", "old": "x", "new": "y"})
        for _ in range(2):
            play_round(guard, ctx, (read("a.py"), OK))
            play_round(guard, ctx, (edit, ToolResult(ok=False, output="old text not found")))
        assert kinds(sink) == [(Level.WARNING, "dead_loop")]

    def test_writing_a_file_back_to_an_earlier_content_is_not_progress(self, tmp_path: Path):
        """Flipping a line and back, or writing the same content again, leaves the window to fill up."""
        guard = DeadLoopGuard(window=6, recent=4, distinct=2)
        ctx, sink = make_ctx()
        ctx.workdir = tmp_path
        guard.before_run(ctx)
        (tmp_path / "a.py").write_text("x = 1\n")
        same = ToolCall(name="write_file", arguments={"path": "a.py", "content": "x = 2\n"})
        check = ToolCall(name="run_check", arguments={})
        for _ in range(3):
            guard.after_model_response(ctx, *answer(same))
            (tmp_path / "a.py").write_text("x = 2\n")  # what the tool did
            guard.after_tool_call(ctx, same, OK)
            play_round(guard, ctx, (check, ToolResult(ok=False, output="x is 2, not 3")))
        assert kinds(sink) == [(Level.WARNING, "dead_loop")]

    def test_rounds_of_several_calls_are_one_fingerprint(self):
        """A round is every call of one answer; the order of calls within it does not matter."""
        guard = DeadLoopGuard(window=6, recent=4, distinct=1)
        ctx, sink = started(guard)
        for index in range(4):
            pair = [(read("a.py"), OK), (read("b.py"), OK)]
            play_round(guard, ctx, *(pair if index % 2 else pair[::-1]))
        assert kinds(sink) == [(Level.WARNING, "dead_loop")]

    def test_calls_sharing_a_long_prefix_are_different_calls(self):
        """Four test ids under one long path (past 100 characters) are four fingerprints, not a loop."""
        guard = DeadLoopGuard(window=6, recent=4, distinct=2)
        ctx, sink = started(guard)
        prefix = "python -m pytest -q -p no:cacheprovider tests/integration/test_greeting_behaviour.py::" + "x" * 40
        for case in range(1, 5):
            command = ToolCall(name="run_command", arguments={"command": f"{prefix}test_case_{case}"})
            play_round(guard, ctx, (command, ToolResult(ok=False, output=f"case {case} failed")))
        assert sink == []

    def test_varied_rounds_are_quiet(self):
        """Rounds with more distinct fingerprints than allowed are exploration, not a loop."""
        guard = DeadLoopGuard(window=6, recent=4, distinct=2)
        ctx, sink = started(guard)
        for path in ["a.py", "b.py", "c.py", "a.py", "b.py", "c.py"]:
            play_round(guard, ctx, (read(path), OK))
        assert sink == []

    def test_a_cycle_warns_only_when_it_starts_a_third_time(self):
        """A B C A B C then D is a second look that went elsewhere: quiet. A B C A B C A warns."""
        for last, expected in (("d.py", []), ("a.py", ["dead loop: a cycle of 3 rounds, a third time"])):
            guard = DeadLoopGuard(window=6, recent=4, distinct=2)
            ctx, sink = started(guard)
            for path in ["a.py", "b.py", "c.py", "a.py", "b.py", "c.py", last]:
                play_round(guard, ctx, (read(path), OK))
            assert [s.message for s in sink] == expected

    def test_a_file_read_with_a_new_time_in_it_is_news(self):
        """A file read is compared exactly: a status file whose clock time moved on is progress, not a loop."""
        guard = DeadLoopGuard(window=6, recent=4, distinct=2)
        ctx, sink = started(guard)
        for second in range(6):
            play_round(guard, ctx, (read("status.log"), ToolResult(ok=True, output=f"job running, updated 12:00:0{second}\n")))
            play_round(guard, ctx, (read("a.py"), OK))
        assert sink == []

    def test_custom_progress_callable(self):
        """A progress callable replaces the progress tools."""
        guard = DeadLoopGuard(recent=2, distinct=1, progress=lambda calls, results: calls[0].name == "run_check")
        ctx, sink = started(guard)
        check = ToolCall(name="run_check", arguments={})
        for _ in range(3):
            play_round(guard, ctx, (check, ToolResult(ok=False, output="1 failed")))
        assert sink == []


class TestContextGuard:
    def test_warns_once_at_85_percent(self):
        """A prompt at 85% of the window warns once with the percentage; later turns stay quiet."""
        guard = ContextGuard(warn_ratio=0.8)
        ctx, sink = started(guard, context_window=1000)
        ctx._prompt_tokens = 700
        guard.after_model_response(ctx, ModelResponse(text="hi"), [])
        assert sink == []
        ctx._prompt_tokens = 850
        guard.after_model_response(ctx, ModelResponse(text="hi"), [])
        ctx._prompt_tokens = 900
        guard.after_model_response(ctx, ModelResponse(text="hi"), [])
        assert sink == [Signal(Level.WARNING, "context_full", "context 85% full")]
        assert "85%" in ctx.take_reminders()[0]

    def test_warns_when_the_prompt_reaches_the_share_exactly(self):
        """A prompt of exactly warn_ratio of the window has reached it."""
        guard = ContextGuard(warn_ratio=0.8)
        ctx, sink = started(guard, context_window=1000)
        ctx._prompt_tokens = 800
        guard.after_model_response(ctx, ModelResponse(text="hi"), [])
        assert sink == [Signal(Level.WARNING, "context_full", "context 80% full")]

    def test_unknown_window_is_quiet(self):
        """Without a known context window the guard says nothing."""
        guard = ContextGuard()
        ctx, sink = started(guard)
        ctx._prompt_tokens = 10**9
        guard.after_model_response(ctx, ModelResponse(text="hi"), [])
        assert sink == []


USER_GUARD = textwrap.dedent(
    """
    class Quiet:
        def after_tool_call(self, ctx, call, result):
            pass

    class NoHooks:
        pass

    class NeedsArgs:
        def __init__(self, x):
            self.x = x

        def before_run(self, ctx):
            pass
    """
)


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"user_guard_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(USER_GUARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


class TestBuilding:
    def test_default_guards_follow_the_config(self):
        """Thresholds come from [guards]: a stop_at of 2 stops the second repeat."""
        guards = default_guards(GuardsConfig(repeat_remind_at=2, repeat_stop_at=2))
        repeat = next(g for g in guards if isinstance(g, RepeatedCallGuard))
        ctx, _ = started(repeat)
        repeat.after_tool_call(ctx, read(), OK)
        with pytest.raises(QualityError):
            repeat.after_tool_call(ctx, read(), OK)
        assert len({type(g) for g in guards}) == 9

    def test_load_guard_instantiates_module_class(self, user_module: str):
        """A "module:Class" spec gives a fresh instance of that class."""
        guard = load_guard(f"{user_module}:Quiet")
        assert type(guard).__name__ == "Quiet"
        assert type(build_guards(GuardsConfig(custom=(f"{user_module}:Quiet",)))[-1]).__name__ == "Quiet"

    @pytest.mark.parametrize(
        "spec",
        ["no_colon", "missing_module_xyz:Guard", "{mod}:Absent", "{mod}:NoHooks", "{mod}:NeedsArgs", ":Quiet"],
    )
    def test_bad_spec_is_a_config_error_naming_the_key(self, user_module: str, spec: str):
        """Every bad spec becomes one line that names [guards] custom."""
        with pytest.raises(ConfigError) as error:
            load_guard(spec.format(mod=user_module))
        assert str(error.value).startswith("[guards] custom:")
        assert "\n" not in str(error.value)

    def test_entry_point_guards_are_added(self, user_module: str, tmp_path: Path):
        """An installed package's entry point in overnight.guards joins the user guards."""
        dist = tmp_path / "overnight_user_guard-1.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: overnight-user-guard\nVersion: 1.0\n")
        (dist / "entry_points.txt").write_text(f"[overnight.guards]\nquiet = {user_module}:Quiet\n")
        guards = user_guards(GuardsConfig())
        assert [type(g).__name__ for g in guards] == ["Quiet"]


class ListRecorder:
    """The loop's trace kept in lists; the loop never reads it back."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.tool_calls: list[tuple[ToolCall, ToolResult]] = []

    def message(self, message: dict) -> None:
        self.messages.append(message)

    def model_call(self, response: ModelResponse) -> None:
        pass

    def tool_call(self, call: ToolCall, result: ToolResult) -> None:
        self.tool_calls.append((call, result))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "app.py").write_text("def answer():\n    return 41\n")
    return tmp_path


def run_with_guards(
    project: Path, *replies, check: str = "grep -q 'return 42' app.py", tools: tuple[str, ...] = (), guards: GuardsConfig | None = None
):
    """Run the real loop over a real toolbox with the default guards; return (signals, error, model)."""
    model = ScriptedModel(replies)
    toolbox = Toolbox(project, [*TOOLS, "search", *tools], check_command=check)
    ctx, sink = make_ctx(context_window=100_000)
    ctx.tool_names = toolbox.names()
    messages = [{"role": "system", "content": "Fix app.py."}, {"role": "user", "content": "Make answer() return 42."}]
    error = None
    try:
        run_agent(model, toolbox, build_guards(guards or GuardsConfig()), messages, ctx, ListRecorder())
    except QualityError as stop:
        error = stop
    return sink, error, model


def loop_context(project: Path, *replies) -> tuple[RunContext, QualityError | None]:
    """Run the real loop with the default guards; return its context (check_passed, turns) and the stop."""
    toolbox = Toolbox(project, [*TOOLS, "search"], check_command="grep -q 'return 42' app.py")
    ctx, _ = make_ctx(context_window=100_000)
    ctx.tool_names = toolbox.names()
    try:
        run_agent(ScriptedModel(replies), toolbox, build_guards(GuardsConfig()), [{"role": "user", "content": "Fix app.py."}], ctx, ListRecorder())
    except QualityError as stop:
        return ctx, stop
    return ctx, None


# The stop at twice the warning count that a user may configure.
STREAK_STOPS = GuardsConfig(failing_streak_stop_at=6)


def reminders_seen(model: ScriptedModel) -> str:
    return "\n".join(str(m.get("content")) for request in model.requests for m in request if m["role"] == "user")


class TestThroughTheAgentLoop:
    def test_repeated_read_warns_then_stops(self, project: Path):
        """Reading the same unchanged file four times: a warning at the third, severe at the fourth."""
        sink, error, model = run_with_guards(project, *[call("read_file", {"path": "app.py"})] * 6)
        assert error is not None and error.reason == "repeated_tool_call"
        assert [(s.level, s.kind, s.message) for s in sink] == [
            (Level.WARNING, "repeated_tool_call", "loop: read_file ×3"),
            (Level.SEVERE, "repeated_tool_call", "loop: read_file ×4"),
        ]
        assert "Do not call it again" in reminders_seen(model)

    def test_a_signal_quoting_a_secret_reaches_the_sink_as_stars(self, project: Path):
        """A user's guard whose warning quotes a secret value (what it read in a file): the signal the log and the run
        store get says *** instead, through the run's redaction."""
        from orchestrator.redactor import Redactor

        token = "deploy-tok-0123456789abc"

        class Quoting:
            def after_tool_call(self, ctx, call, result):
                ctx.report(Level.WARNING, "quoted", f"saw {token} in {call.name}")

        sink: list[Signal] = []
        ctx = RunContext(max_turns=30, tool_names=list(TOOLS), sink=sink.append, redact=Redactor([token]))
        model = ScriptedModel([call("read_file", {"path": "app.py"}), call("submit", {"summary": "x"})])
        run_agent(model, Toolbox(project, TOOLS, check_command="true"), [Quoting()], [], ctx, ListRecorder())
        assert [s.message for s in sink] == ["saw *** in read_file", "saw *** in submit"]

    def test_a_passing_check_run_three_times_is_told_to_submit_not_to_change_the_code(self, project: Path):
        """The reminder after the third passing run_check: the work is done, submit. It said "change the code",
        which sends a model that never submits to undo the fix."""
        sink, error, model = run_with_guards(
            project,
            call("edit_file", {"path": "app.py", "old": "return 41", "new": "return 42"}),
            *[call("run_check")] * 3,
            call("submit", {"summary": "answer() returns 42"}),
        )
        assert error is None
        assert "loop: run_check ×3" in [s.message for s in sink]
        reminder = model.requests[4][-1]["content"]
        assert "Call submit" in reminder and "change the code" not in reminder

    def test_circling_after_the_check_passed_is_told_to_submit_not_to_make_a_change(self, project: Path):
        """Checking and reading in turn once the fix passes: the dead-loop reminder says the work is done. It said
        "decide on one change, make it", which sends a model that never submits to change working code."""
        sink, error, model = run_with_guards(
            project,
            call("edit_file", {"path": "app.py", "old": "return 41", "new": "return 42"}),
            *[call("run_check"), call("read_file", {"path": "app.py"})] * 2,
            call("submit", {"summary": "answer() returns 42"}),
        )
        assert error is None
        assert [s.kind for s in sink] == ["dead_loop"]
        reminder = model.requests[5][-1]["content"]
        assert "call submit" in reminder and "decide on one change" not in reminder

    def test_edit_and_recheck_runs_to_submit(self, project: Path):
        """Checking, editing, re-reading and re-checking until it passes is never stopped."""
        sink, error, _ = run_with_guards(
            project,
            call("run_check"),
            call("read_file", {"path": "app.py"}),
            call("edit_file", {"path": "app.py", "old": "return 41", "new": "return 40"}),
            call("run_check"),
            call("read_file", {"path": "app.py"}),
            call("edit_file", {"path": "app.py", "old": "return 40", "new": "return 42"}),
            call("read_file", {"path": "app.py"}),
            call("run_check"),
            call("submit", {"summary": "answer() returns 42"}),
        )
        assert error is None
        assert sink == []

    def test_two_empty_answers_stop(self, project: Path):
        """An empty answer is nudged; a second one in a row ends the run with empty_response."""
        sink, error, model = run_with_guards(project, say(""), say(""))
        assert error is not None and error.reason == "empty_response"
        assert kinds(sink) == [(Level.WARNING, "empty_response"), (Level.SEVERE, "empty_response")]
        assert "Your last answer was empty" in reminders_seen(model)

    def test_unknown_tool_twice_stops(self, project: Path):
        """Calling a tool that does not exist in two answers in a row ends the run with unknown_tool."""
        sink, error, _ = run_with_guards(project, call("bash", {"cmd": "ls"}), call("bash", {"cmd": "ls"}))
        assert error is not None and error.reason == "unknown_tool"
        assert [(s.level, s.message) for s in sink] == [
            (Level.WARNING, "unknown tool: bash"),
            (Level.SEVERE, "unknown tool: bash ×2"),
        ]

    def test_broken_arguments_three_times_stop(self, project: Path):
        """Arguments that never parse or fit end the run with broken_tool_call at the third answer."""
        sink, error, _ = run_with_guards(
            project,
            call("write_file", "{{{"),
            call("write_file", '{"path": "app.py"}'),
            call("write_file", "{{{"),
            call("submit", {"summary": "x"}),
        )
        assert error is not None and error.reason == "broken_tool_call"
        assert kinds(sink) == [(Level.WARNING, "broken_tool_call")] * 2 + [(Level.SEVERE, "broken_tool_call")]

    def test_prose_and_empty_answers_in_turn_stop_at_the_third(self, project: Path):
        """A model that alternates prose and empty answers never acts; it is stopped at the third answer."""
        sink, error, _ = run_with_guards(project, *[say("I will now read app.py."), say("")] * 5)
        assert error is not None and error.reason == "no_tool_call"
        assert kinds(sink) == [(Level.WARNING, "empty_response"), (Level.SEVERE, "no_tool_call")]

    def test_reading_and_failing_edits_in_a_circle_warns_and_goes_on(self, project: Path):
        """Issue 4's contract: a failing streak warns (from the third failed edit here) and the run goes on to the fix."""
        replies = []
        for old in ("return 4l", "retrun 41", "return 41 ", "return  41", "Return 41", "return '41'", "return 14"):
            replies += [call("read_file", {"path": "app.py"}), call("edit_file", {"path": "app.py", "old": old, "new": "return 42"})]
        fix = [call("edit_file", {"path": "app.py", "old": "return 41", "new": "return 42"}), call("run_check"), call("submit", {"summary": "s"})]
        sink, error, _ = run_with_guards(project, *replies, *fix)
        assert error is None
        assert {(s.level, s.kind) for s in sink} == {(Level.WARNING, "failing_streak")}
        assert [s.message for s in sink][0] == "failing: 3 failed calls, nothing new in between"

    def test_reading_and_failing_edits_in_a_circle_warns_then_stops_when_told(self, project: Path):
        """With `failing_streak_stop_at = 6`: a warning at the third failed edit, a stop at the sixth."""
        replies = []
        for old in ("return 4l", "retrun 41", "return 41 ", "return  41", "Return 41", "return '41'", "return 14"):
            replies += [call("read_file", {"path": "app.py"}), call("edit_file", {"path": "app.py", "old": old, "new": "return 42"})]
        sink, error, _ = run_with_guards(project, *replies, guards=STREAK_STOPS)
        assert error is not None and error.reason == "failing_streak"
        assert [(s.level, s.kind) for s in sink if s.kind == "failing_streak"][0] == (Level.WARNING, "failing_streak")
        assert [t for t, s in enumerate(sink) if s.level is Level.SEVERE] == [len(sink) - 1]

    def test_a_check_passed_again_after_an_edit_in_the_same_answer_keeps_the_stop_off(self, project: Path):
        """[run_check, edit_file, run_check] in one answer: the second check, a copy by its call, passed after the
        edit. Failed edits after it only warn, as they do when the check passed in an answer of its own."""
        fix = calls(("run_check", {}), ("edit_file", {"path": "app.py", "old": "return 41", "new": "return 42"}), ("run_check", {}))
        failed_edits = [call("edit_file", {"path": "app.py", "old": f"nothing like this {index}", "new": "x"}) for index in range(6)]
        sink, error, _ = run_with_guards(
            project, call("run_check"), fix, *failed_edits, call("submit", {"summary": "fixed"}), guards=STREAK_STOPS
        )
        assert error is None
        assert {(s.level, s.kind) for s in sink} == {(Level.WARNING, "failing_streak")}
        assert sum(1 for s in sink if s.kind == "failing_streak") == 4

    def test_flip_flopping_an_edit_warns_at_the_third_check_and_stops_at_the_sixth(self, project: Path):
        """Editing a line and back, checking after each: the undo restores the original, so it is no progress (a stop when told to)."""
        there = call("edit_file", {"path": "app.py", "old": "return 41", "new": "return 40"})
        back = call("edit_file", {"path": "app.py", "old": "return 40", "new": "return 41"})
        sink, error, model = run_with_guards(project, *[there, call("run_check"), back, call("run_check")] * 5, guards=STREAK_STOPS)
        assert error is not None and error.reason == "failing_streak"
        assert [s.message for s in sink][0] == "failing: 3 failed calls, nothing new in between"
        assert len(model.requests) == 12

    def test_a_burst_of_one_call_in_the_first_answer_is_not_a_stop(self, project: Path):
        """Four copies of one read in the first answer warn as many calls; the run goes on to submit."""
        sink, error, _ = run_with_guards(
            project,
            calls(*[("read_file", {"path": "app.py"})] * 4),
            call("edit_file", {"path": "app.py", "old": "return 41", "new": "return 42"}),
            call("run_check"),
            call("submit", {"summary": "fixed"}),
        )
        assert error is None
        assert kinds(sink) == [(Level.WARNING, "many_calls")]

    def test_a_burst_of_one_failing_check_in_the_first_answer_is_not_a_stop(self, project: Path):
        """Six copies of the failing check in the first answer: a many-calls warning, one failure; the run goes on."""
        sink, error, _ = run_with_guards(
            project,
            calls(*[("run_check", {})] * 6),
            call("edit_file", {"path": "app.py", "old": "return 41", "new": "return 42"}),
            call("run_check"),
            call("submit", {"summary": "fixed"}),
        )
        assert error is None
        assert kinds(sink) == [(Level.WARNING, "many_calls")]

    def test_diagnosing_failures_before_editing_is_never_flagged(self, project: Path):
        """The check fails, then probes and greps fail, each with a new output, before the fix: no signal at all."""
        probe = f"{sys.executable} -S -c 'import app; assert app.answer() == 42, app.answer()'"
        sink, error, _ = run_with_guards(
            project,
            call("run_check"),
            call("run_command", {"command": probe}),
            call("run_command", {"command": "grep -rn 'def sub' ."}),
            call("run_command", {"command": "grep -rn 'import operator' ."}),
            call("run_command", {"command": "ls no_such_folder"}),
            call("run_command", {"command": "grep -rn 'return 40' ."}),
            call("edit_file", {"path": "app.py", "old": "return 41", "new": "return 42"}),
            call("run_check"),
            call("submit", {"summary": "fixed"}),
            tools=("run_command",),
        )
        assert error is None
        assert sink == []

    def test_failing_tool_probes_after_the_check_passed_do_not_stop(self, project: Path):
        """The fix passes the check; six failing lookups for tools that are not there (all new) never stop it."""
        probes = ["no_such_tool_a --version", "which no_such_tool_b", "no_such_tool_c check .", "no_such_tool_d app.py",
                  f"{sys.executable} -S -c 'import no_such_module_e'", "no_such_tool_f app.py"]
        sink, error, _ = run_with_guards(
            project,
            call("edit_file", {"path": "app.py", "old": "return 41", "new": "return 42"}),
            call("run_check"),
            *[call("run_command", {"command": command}) for command in probes],
            call("submit", {"summary": "fixed"}),
            tools=("run_command",),
        )
        assert error is None
        assert sink == []

    def test_failing_guesses_warn_and_dead_loop_reminds(self, project: Path):
        """Guessed paths warn as a failing streak; circling between two reads gets a dead-loop reminder."""
        sink, error, model = run_with_guards(
            project,
            call("read_file", {"path": "src/app.py"}),
            call("read_file", {"path": "lib/app.py"}),
            call("read_file", {"path": "app/app.py"}),
            calls(("list_dir", {}), ("read_file", {"path": "app.py"})),
            call("search", {"pattern": "answer"}),
            calls(("read_file", {"path": "app.py"}), ("list_dir", {})),
            call("search", {"pattern": "answer"}),
            call("edit_file", {"path": "app.py", "old": "return 41", "new": "return 42"}),
            call("run_check"),
            call("submit", {"summary": "fixed"}),
        )
        assert error is None
        assert [(s.level, s.message) for s in sink] == [
            (Level.WARNING, "failing: 3 tool calls in a row"),
            (Level.WARNING, "dead loop: 2 calls over 4 rounds"),
        ]
        seen = reminders_seen(model)
        assert "list_dir" in seen and "same few calls" in seen

    def test_prose_is_answered_with_a_nudge_to_call_a_tool(self, project: Path):
        """An answer of prose alone gets a user message back telling the model to call a tool."""
        _, error, model = run_with_guards(project, say("I would read app.py next."), call("submit", {"summary": "s"}))
        assert error is None
        assert model.requests[1][-2] == {"role": "assistant", "content": "I would read app.py next."}
        assert "You did not call a tool" in model.requests[1][-1]["content"]

    def test_a_call_after_prose_cut_off_is_answered_as_cut_off_not_as_no_call(self, project: Path):
        """An answer that ends as usual inside a call written after prose is told its call was cut off, not that it
        called no tool."""
        cut = say('I will write it now. {"name": "write_file", "arguments": {"path": "b.py", "content": "x = ')
        _, error, model = run_with_guards(project, cut, call("submit", {"summary": "s"}))
        assert error is None
        told = "\n".join(str(message.get("content")) for message in model.requests[1][2:])
        assert "You did not call a tool" not in told and "end in the middle of a value" in told, told

    def test_an_empty_answer_leaves_no_trace_in_the_history(self, project: Path):
        """After an empty answer the next request is the same history; only the nudge is joined to its last message."""
        _, error, model = run_with_guards(project, say(""), call("submit", {"summary": "s"}))
        assert error is None
        first, second = model.requests[:2]
        assert [m["role"] for m in second] == [m["role"] for m in first] == ["system", "user"]
        assert second[-1]["content"].startswith(first[-1]["content"]) and "Your last answer was empty" in second[-1]["content"]

    def test_a_reminder_goes_with_the_next_request_only(self, project: Path):
        """The repeat reminder after the third read is in the fourth request, and in none after it."""
        read_app = call("read_file", {"path": "app.py"})
        _, error, model = run_with_guards(project, read_app, read_app, read_app, call("list_dir"), call("list_dir", {"path": "x"}))
        assert error is not None  # the script ran out: empty answers
        said = ["Do not call it again" in "\n".join(str(m.get("content")) for m in request) for request in model.requests]
        assert said[:6] == [False, False, False, True, False, False]

    def test_the_same_reminder_twice_in_a_turn_is_sent_once(self, project: Path):
        """A guard that reminds on every write (docs/guards.md's NoTodoGuard) reminds once for two writes in one answer."""

        class NoTodoGuard:
            def after_tool_call(self, ctx, call, result):
                if call.name in ("write_file", "edit_file") and "TODO" in str(call.arguments):
                    ctx.remind("Write the code itself, not a TODO.")

        model = ScriptedModel(
            [
                calls(("write_file", {"path": "a.py", "content": "# TODO\n"}), ("write_file", {"path": "b.py", "content": "# TODO\n"})),
                call("submit", {"summary": "s"}),
            ]
        )
        toolbox = Toolbox(project, TOOLS, check_command="true")
        ctx, _ = make_ctx()
        run_agent(model, toolbox, [NoTodoGuard()], [{"role": "user", "content": "Fix app.py."}], ctx, ListRecorder())
        assert "\n".join(str(m.get("content")) for m in model.requests[1]).count("not a TODO") == 1

    def test_the_context_guard_sees_the_prompt_size_the_server_counted(self, project: Path):
        """The prompt tokens of each response reach the context guard: 90,000 of 100,000 warns."""
        sink, error, _ = run_with_guards(
            project, call("read_file", {"path": "app.py"}, prompt_tokens=90_000), call("submit", {"summary": "s"})
        )
        assert error is None
        assert [(s.kind, s.message) for s in sink] == [("context_full", "context 90% full")]

    def test_a_passing_check_stays_passed_across_looking_calls_only(self, project: Path):
        """After the model's passing run_check, reads and searches leave check_passed set (a stop keeps the work);
        a successful edit since clears it, and only run_check sets it."""
        fix = call("edit_file", {"path": "app.py", "old": "return 41", "new": "return 42"})
        search = call("search", {"pattern": "answer"})
        ctx, error = loop_context(project, fix, call("run_check"), call("read_file", {"path": "app.py"}), *[search] * 4)
        assert error is not None and error.reason == "repeated_tool_call" and ctx.check_passed is True
        comment = call("edit_file", {"path": "app.py", "old": "return 42", "new": "return 42  # the answer"})
        ctx, error = loop_context(project, call("run_check"), comment, *[call("read_file", {"path": "app.py"})] * 4)
        assert error is not None and error.reason == "repeated_tool_call" and ctx.check_passed is False


class TestACrashingGuard:
    def test_a_guard_that_raises_is_logged_reported_and_left_out(self, project: Path):
        """A bug in a user's guard (KeyError) is a guard_error log and warning naming it; the healthy run still submits."""
        from structlog.testing import capture_logs

        class AsciiPathGuard:
            def __init__(self) -> None:
                self.calls = 0

            def after_tool_call(self, ctx, call, result):
                self.calls += 1
                call.arguments["path"]  # KeyError on run_check

        crashy = AsciiPathGuard()
        model = ScriptedModel(
            [
                call("edit_file", {"path": "app.py", "old": "return 41", "new": "return 42"}),
                call("run_check"),
                call("run_check"),
                call("submit", {"summary": "fixed"}),
            ]
        )
        toolbox = Toolbox(project, TOOLS, check_command="grep -q 'return 42' app.py")
        ctx, sink = make_ctx()
        with capture_logs() as logs:
            result = run_agent(model, toolbox, [*default_guards(GuardsConfig()), crashy], [], ctx, ListRecorder())
        assert result.summary == "fixed"
        assert crashy.calls == 2  # after the crash at the first run_check it is called no more
        assert [(s.level, s.kind) for s in sink] == [(Level.WARNING, "guard_error")]
        assert "AsciiPathGuard" in sink[0].message and "KeyError" in sink[0].message
        errors = [entry for entry in logs if entry["event"] == "guard_error"]
        assert [(e["guard"], e["hook"], e["error"]) for e in errors] == [("AsciiPathGuard", "after_tool_call", "KeyError: 'path'")]


    def test_in_a_night_the_guard_error_event_names_the_run_task_and_iteration(self, tmp_path, monkeypatch, capsys):
        """With tasks in parallel, which task's guard failed is in the event, as for every iteration event."""
        import json

        from orchestrator.fake_server import ScriptedServer
        from tests.conftest import SAMPLE_FILES, make_repo, write_config
        from tests.test_night import FIX, overnight

        (tmp_path / "crashing_guard_module.py").write_text(
            "class Crashing:\n    def after_tool_call(self, ctx, call, result):\n        raise RuntimeError('boom')\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, "crashing_guard_module", raising=False)
        repo = make_repo(tmp_path / "repo", SAMPLE_FILES)
        with ScriptedServer(list(FIX)) as server:
            config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, guards={"custom": ["crashing_guard_module:Crashing"]})
            capsys.readouterr()
            assert overnight("run", "--config", str(config), "--log-format", "json") == 0
        events = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
        [error] = [e for e in events if e["event"] == "guard_error"]
        assert (error["guard"], error["task"], error["iteration"]) == ("Crashing", "fix-greet", 1)
        assert all(isinstance(error[key], int) for key in ("run_id", "task_run_id", "iteration_id"))

    def test_a_secret_the_guards_error_quotes_shows_stars_in_the_log_and_the_store(self, tmp_path, monkeypatch, capsys):
        """A user's guard whose exception quotes a secret variable's value: guard_error's error and traceback, and the
        warning signal the run store keeps, show *** instead."""
        import json

        from orchestrator.fake_server import ScriptedServer
        from tests.conftest import SAMPLE_FILES, make_repo, write_config
        from tests.test_night import FIX, overnight
        from tests.test_secrecy import written_down

        token = "deploy-tok-0123456789abc"
        monkeypatch.setenv("DEPLOY_TOKEN", token)
        (tmp_path / "quoting_guard_module.py").write_text(
            "import os\n"
            "class Quoting:\n"
            "    def after_tool_call(self, ctx, call, result):\n"
            "        raise RuntimeError('refused with ' + os.environ['DEPLOY_TOKEN'])\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, "quoting_guard_module", raising=False)
        repo = make_repo(tmp_path / "repo", SAMPLE_FILES)
        with ScriptedServer(list(FIX)) as server:
            config = write_config(tmp_path / "overnight.toml", api_base=server.url, repo=repo, guards={"custom": ["quoting_guard_module:Quoting"]})
            capsys.readouterr()
            assert overnight("run", "--config", str(config), "--log-format", "json") == 0
        said = capsys.readouterr()
        events = [json.loads(line) for line in said.err.splitlines() if line.startswith("{")]
        [error] = [e for e in events if e["event"] == "guard_error"]
        assert error["error"] == "RuntimeError: refused with ***" and "RuntimeError: refused with ***" in error["exception"]
        assert [e["message"] for e in events if e["event"] == "signal" and e["kind"] == "guard_error"] == [
            "guard Quoting failed in after_tool_call (RuntimeError: refused with ***); left out for this run"
        ]
        assert [text for text in written_down(config, said.out + said.err) if token in text] == []

    def test_a_crashing_guard_equal_to_a_healthy_one_leaves_the_healthy_one_in(self, project: Path):
        """Two guards that compare equal (one dataclass, the same fields): only the one that crashed is left out."""
        from dataclasses import dataclass, field

        @dataclass
        class Watch:
            crash: bool = field(default=False, compare=False)
            seen: int = field(default=0, compare=False)

            def after_tool_call(self, ctx, call, result):
                self.seen += 1
                if self.crash:
                    raise RuntimeError("bug")

        healthy, crasher = Watch(), Watch(crash=True)
        assert healthy == crasher
        model = ScriptedModel(
            [call("read_file", {"path": "app.py"}), call("list_dir", {}), call("run_check"), call("submit", {"summary": "x"})]
        )
        toolbox = Toolbox(project, TOOLS, check_command="true")
        ctx, sink = make_ctx()
        run_agent(model, toolbox, [healthy, crasher], [], ctx, ListRecorder())
        assert (healthy.seen, crasher.seen) == (4, 1)
        assert [s.kind for s in sink] == ["guard_error"]

    def test_a_run_store_failing_under_a_guards_signal_is_a_store_failure_not_the_guards(self, project: Path, tmp_path: Path):
        """The store could not write a batch of events (locked past its busy timeout): the failure is raised once,
        at the next write, here the repeat warning's signal. It ends the run as StateError; it was taken for a
        bug in RepeatedCallGuard, which was left out (the fourth read went on unstopped) and the failure lost."""
        from orchestrator.errors import StateError
        from runs import RunStore
        from tests.test_store_faults import hold_the_database

        database = tmp_path / "runs.db"
        RunStore.open(f"sqlite:///{database}").close()
        store = RunStore.open(f"sqlite:///{database}?timeout=0.2")
        try:
            run_id = store.begin_run(config_path="c", pid=1, host="h")
            iteration_id = store.begin_iteration(store.begin_task(run_id, name="t", branch="b"), number=1, checkpoint="c", pid=1)
            holder = hold_the_database(database, 1.5)
            store.record_tool_call(iteration_id, name="read_file", ok=True)  # its batch fails: the database is locked
            holder.join()
            signals: list[Signal] = []

            def to_the_store(signal: Signal) -> None:
                signals.append(signal)
                store.record_signal(iteration_id, level=signal.level.value, kind=signal.kind, message=signal.message)

            ctx = RunContext(max_turns=30, tool_names=list(TOOLS), sink=to_the_store)
            model = ScriptedModel([call("read_file", {"path": "app.py"})] * 6)
            with pytest.raises(StateError, match="database is locked"):
                run_agent(model, Toolbox(project, TOOLS, check_command="true"), default_guards(GuardsConfig()), [], ctx, ListRecorder())
            assert [s.kind for s in signals] == ["repeated_tool_call"]
        finally:
            store.close()


class TestNoToolCallGuard:
    """Prose without calls, and many calls at once: what real small models do."""

    def _ctx(self):
        from orchestrator.agent import RunContext

        signals: list = []
        return RunContext(max_turns=10, tool_names=["read_file"], sink=signals.append), signals

    def test_prose_three_times_in_a_row_stops(self):
        """The third answer in a row with text and no call raises no_tool_call."""
        import pytest

        from guards.no_tool_call import NoToolCallGuard
        from orchestrator.errors import QualityError
        from orchestrator.records import ModelResponse

        guard, (ctx, _) = NoToolCallGuard(stop_at=3), self._ctx()
        guard.before_run(ctx)
        guard.after_model_response(ctx, ModelResponse(text="I will read the file."), [])
        guard.after_model_response(ctx, ModelResponse(text="<tool_response>ok</tool_response>"), [])
        with pytest.raises(QualityError) as stop:
            guard.after_model_response(ctx, ModelResponse(text="Done, I think."), [])
        assert stop.value.reason == "no_tool_call"

    def test_a_call_or_an_empty_answer_resets(self):
        """A call in between, or an empty answer (another guard's business), resets the count."""
        from guards.no_tool_call import NoToolCallGuard
        from orchestrator.records import ModelResponse, ToolCall

        guard, (ctx, _) = NoToolCallGuard(stop_at=2), self._ctx()
        guard.before_run(ctx)
        guard.after_model_response(ctx, ModelResponse(text="talk"), [])
        guard.after_model_response(ctx, ModelResponse(text=""), [ToolCall("read_file", {"path": "a"})])
        guard.after_model_response(ctx, ModelResponse(text="talk"), [])
        guard.after_model_response(ctx, ModelResponse(text=""), [])
        guard.after_model_response(ctx, ModelResponse(text="talk"), [])

    def test_many_calls_in_one_answer_warns_and_reminds(self):
        """Four calls in one answer: a many_calls warning and a one-at-a-time reminder, no stop."""
        from guards.no_tool_call import NoToolCallGuard
        from orchestrator.records import ModelResponse, ToolCall

        guard, (ctx, signals) = NoToolCallGuard(many_calls_at=4), self._ctx()
        guard.before_run(ctx)
        calls = [ToolCall("read_file", {"path": str(i)}) for i in range(4)]
        guard.after_model_response(ctx, ModelResponse(text=""), calls)
        assert [(s.level.value, s.kind) for s in signals] == [("warning", "many_calls")]
        assert any("one tool call" in r for r in ctx.take_reminders())
