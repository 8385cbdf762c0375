"""Parsing tool calls, native and written in text, against the tools' schemas."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from orchestrator.records import BrokenCall, ModelResponse, RawToolCall, ToolCall
from orchestrator.toolcalls import MAX_JSON_DEPTH, arguments_problem, describe_call, parse_calls
from orchestrator.tools import Toolbox

SCHEMAS = Toolbox(
    Path("."),
    ["read_file", "write_file", "edit_file", "list_dir", "search", "run_check", "submit"],
    check_command="true",
).schemas()


def native(*pairs: tuple[str, str], finish_reason: str = "tool_calls") -> list[ToolCall | BrokenCall]:
    raw = tuple(RawToolCall(name=name, arguments=args, id=f"call_{i}") for i, (name, args) in enumerate(pairs))
    return parse_calls(ModelResponse(text="", tool_calls=raw, finish_reason=finish_reason), SCHEMAS)


def written(text: str, finish_reason: str = "stop") -> list[ToolCall | BrokenCall]:
    return parse_calls(ModelResponse(text=text, finish_reason=finish_reason), SCHEMAS)


def only(calls: list[ToolCall | BrokenCall]) -> ToolCall | BrokenCall:
    assert len(calls) == 1, calls
    return calls[0]


def assert_cut_off(call: ToolCall | BrokenCall, name: str) -> None:
    """`call` is a broken call to `name` saying it was cut off (never run)."""
    assert isinstance(call, BrokenCall) and (call.name, call.problem) == (name, "unparseable"), call
    assert "end in the middle of a value" in call.detail, call


def as_answer(call: str, form: str) -> str:
    """`call` as the whole answer (`bare`), on a line after the model's words, in a ```json fence, or in `<tool_call>` tags."""
    return {
        "bare": call,
        "after-prose": "I will write it.\n" + call,
        "fenced": "```json\n" + call + "\n```",
        "tagged": "<tool_call>\n" + call + "\n</tool_call>",
    }[form]


class TestNativeCalls:
    def test_valid_call_becomes_tool_call(self):
        """A native call whose arguments fit the schema becomes a ToolCall with its id."""
        call = only(native(("read_file", '{"path": "a.py"}')))
        assert call == ToolCall("read_file", {"path": "a.py"}, id="call_0", source="native")

    def test_empty_arguments_mean_no_arguments(self):
        """An empty arguments string is an empty object, fine for a tool without parameters."""
        assert only(native(("run_check", ""))) == ToolCall("run_check", {}, id="call_0")

    def test_several_calls_keep_their_order(self):
        """Several native calls come back in order, each checked on its own."""
        calls = native(("read_file", '{"path": "a"}'), ("nope", "{}"), ("list_dir", "{}"))
        assert [type(c).__name__ for c in calls] == ["ToolCall", "BrokenCall", "ToolCall"]
        assert calls[1].problem == "unknown_tool"

    def test_empty_name_is_reported(self):
        """A call with a whitespace-only name is an empty_tool_name BrokenCall."""
        call = only(native(("  ", '{"path": "a"}')))
        assert isinstance(call, BrokenCall) and call.problem == "empty_tool_name"

    def test_unknown_tool_names_the_tools(self):
        """A call to a tool not in the schemas is unknown_tool, and the detail lists the real tools."""
        call = only(native(("run_command", '{"command": "ls"}')))
        assert isinstance(call, BrokenCall) and call.problem == "unknown_tool"
        assert "read_file" in call.detail and "run_command" in call.detail

    def test_missing_required_parameter_is_invalid(self):
        """Valid JSON missing a required parameter is invalid, naming the parameter."""
        call = only(native(("write_file", '{"path": "a.py"}')))
        assert isinstance(call, BrokenCall)
        assert (call.problem, call.detail) == ("invalid", "missing required parameter 'content'")

    def test_wrong_type_is_invalid(self):
        """A parameter of the wrong JSON type is invalid, saying what was expected."""
        call = only(native(("read_file", '{"path": ["a.py"]}')))
        assert isinstance(call, BrokenCall) and call.problem == "invalid"
        assert call.detail == "parameter 'path' must be a string, got array"

    def test_unknown_parameter_is_invalid(self):
        """An extra parameter the tool does not declare is invalid, not dropped."""
        call = only(native(("read_file", '{"path": "a.py", "lines": "1-5"}')))
        assert isinstance(call, BrokenCall) and call.problem == "invalid"
        assert "unknown parameter 'lines'" in call.detail

    def test_json_string_encoding_an_object_is_decoded(self):
        """Arguments sent as a JSON string holding an object are the one coercion allowed."""
        call = only(native(("read_file", json.dumps(json.dumps({"path": "a.py"})))))
        assert call == ToolCall("read_file", {"path": "a.py"}, id="call_0")

    def test_non_object_json_is_unparseable(self):
        """Arguments that are valid JSON but not an object cannot be a call."""
        call = only(native(("read_file", "[1, 2]")))
        assert isinstance(call, BrokenCall) and call.problem == "unparseable"

    def test_repairable_json_that_fits_is_accepted(self):
        """A trailing comma is repaired, and the repaired arguments fit, so the call runs."""
        assert only(native(("read_file", '{"path": "a.py",}'))) == ToolCall("read_file", {"path": "a.py"}, id="call_0")

    def test_raw_newline_inside_a_string_is_accepted(self):
        """A literal newline inside a JSON string, as small models write, still parses."""
        call = only(native(("write_file", '{"path": "a.py", "content": "x = 1\ny = 2\n"}')))
        assert call == ToolCall("write_file", {"path": "a.py", "content": "x = 1\ny = 2\n"}, id="call_0")

    def test_garbage_stays_unparseable(self):
        """Garbage that repair turns into a non-object is unparseable, with the JSON error."""
        call = only(native(("write_file", "}{ path => x ;; ][")))
        assert isinstance(call, BrokenCall) and call.problem == "unparseable"
        assert call.detail.startswith("arguments are not valid JSON: Expecting value at char 0")

    def test_garbage_repaired_into_an_object_that_does_not_fit_is_broken(self):
        """Garbage that repair turns into {"content": []} is a BrokenCall, never a call."""
        call = only(native(("write_file", "{content: [}{ path => x")))
        assert isinstance(call, BrokenCall) and call.problem == "invalid"
        assert "not valid JSON" in call.detail and "missing required parameter 'path'" in call.detail

    def test_arguments_cut_at_the_length_limit_are_unparseable(self):
        """Arguments cut off at the length limit are never completed by repair."""
        call = only(native(("write_file", '{"path": "a.py", "content": "def f('), finish_reason="length"))
        assert isinstance(call, BrokenCall)
        assert (call.problem, call.detail) == ("unparseable", "cut off at the length limit")

    @pytest.mark.parametrize(
        ("tool", "arguments"),
        [
            ("edit_file", '{"path": "greet.py", "old": "helo", "new": '),
            ("edit_file", '{"path": "greet.py", "old": "helo", "new": "hel'),
            ("edit_file", '{"path": "greet.py", "old": "helo", "new"'),
            ("edit_file", '{"path": "greet.py", "old": "helo", "new": "hel\\u00'),
            ("search", '{"pattern": "helo", "path": nu'),
            ("read_file", '{"path": "a.py", "start_line": -'),
        ],
        ids=["before-a-value", "inside-a-string", "before-a-colon", "inside-an-escape", "inside-a-literal", "after-a-sign"],
    )
    def test_arguments_that_end_mid_value_are_unparseable_though_not_at_the_length_limit(self, tool, arguments):
        """Arguments that stop where a value was due or inside a string are never run as repair would have them
        (`"new": ` read as "", an edit that deletes), even when the server said the answer ended as it should."""
        call = only(native((tool, arguments)))
        assert isinstance(call, BrokenCall) and call.problem == "unparseable", call
        assert call.detail.startswith("the arguments end in the middle of a value, as if cut off (")

    def test_arguments_with_a_stray_backslash_that_end_mid_value_are_unparseable(self):
        """Arguments with a slip the repair mends (a regex's `\\d`) that then stop where a value was due are cut off
        too: the slip's error comes first, but the edit would still run with `"new": ` read as ""."""
        call = only(native(("edit_file", '{"path": "nums.py", "old": "re.compile(\'\\d+\')", "new": ')))
        assert isinstance(call, BrokenCall) and call.problem == "unparseable", call
        assert call.detail.startswith("the arguments end in the middle of a value, as if cut off (")

    @pytest.mark.parametrize(
        "arguments",
        ["{'path': 'greet.py', 'old': 'helo', 'new': ", "{'path': 'greet.py', 'old': 'helo', 'new':", '{path: "greet.py", old: "helo", new: '],
        ids=["single-quoted", "single-quoted-no-space", "unquoted-keys"],
    )
    def test_json5_like_arguments_that_end_where_a_value_was_due_are_unparseable(self, arguments):
        """Arguments with single quotes or unquoted keys (a slip the repair mends) that stop after a key's colon are
        cut off too, not an edit that deletes with `new` read as ""."""
        call = only(native(("edit_file", arguments)))
        assert isinstance(call, BrokenCall) and call.problem == "unparseable", call
        assert call.detail.startswith("the arguments end in the middle of a value, as if cut off (")

    def test_whole_arguments_followed_by_words_that_end_in_a_colon_still_run(self):
        """Whole arguments, then a line of the model's words ending in a colon: no value was due, and the call runs."""
        call = only(native(("read_file", '{"path": "a.py"}\nNext I will run:')))
        assert call == ToolCall("read_file", {"path": "a.py"}, id="call_0"), call

    @pytest.mark.parametrize(
        ("tool", "arguments"),
        [
            ("write_file", "{'path': 'greet.py', 'content': 'def f(x):\\n    return"),
            ("write_file", "{'path': 'greet.py', 'content': \"def f(x):\\n    return"),
            ("write_file", '{path: "greet.py", content: "def f(x):\\n    return'),
            ("edit_file", "{'path': 'greet.py', 'old': 'helo', 'new': 'it\\'s"),
            ("edit_file", "{'path': 'greet.py', 'old': 'helo', 'new'"),
            ("search", "{'pattern': 'helo', 'path': Non"),
        ],
        ids=["single-quoted", "double-quoted-after-single", "unquoted-keys", "after-an-escaped-quote", "after-a-key", "inside-a-literal"],
    )
    def test_json5_like_arguments_that_end_mid_value_are_unparseable(self, tool, arguments):
        """Arguments with single quotes or unquoted keys that stop inside a string, after a key or inside a literal are cut
        off too: repaired, the file would be written with half its content."""
        call = only(native((tool, arguments)))
        assert isinstance(call, BrokenCall) and call.problem == "unparseable", call
        assert call.detail.startswith("the arguments end in the middle of a value, as if cut off (")

    @pytest.mark.parametrize(
        "arguments",
        [
            "{'path': 'a.py', 'content': 'return {'",
            "{'path': 'a.py', 'content': 'print('",
            "{\"path\": \"a.py\", \"content\": 'return {'",
            "{'path': 'a.py', 'content': 's = 'x'",
            "{'path': 'a.py', 'content': 'd = {'a': 'b', 'c': 'x'",
            "{'path': 'a.txt', 'content': 'it's done'",
        ],
        ids=[
            "after-a-brace", "after-a-paren", "double-quoted-keys", "after-an-assignment", "after-quoted-keys-in-the-content",
            "whole-or-cut-after-an-apostrophe",
        ],
    )
    def test_json5_like_arguments_that_never_close_and_end_on_a_quote_inside_a_string_are_unparseable(self, arguments):
        """Single-quoted arguments that never close and end on a quote (then only closing brackets) that may be one inside
        the content, the answer stopped after it, are cut off, never run (repaired, a write ran with its content cut); whole
        arguments of that shape (`'it's done'`, the brace missing) cannot be told from cut ones, and are lost."""
        call = only(native(("write_file", arguments)))
        assert isinstance(call, BrokenCall) and call.problem == "unparseable", call
        assert call.detail.startswith("the arguments end in the middle of a value, as if cut off (")

    @pytest.mark.parametrize(
        "arguments",
        [
            "{'path': 'f.py', 'content': 'if x == 'y':\\n",
            "{'path': 'f.py', 'content': 'CONFIG = {\\n    'debug': False,",
        ],
        ids=["after-a-colon", "after-a-comma"],
    )
    def test_json5_like_arguments_that_never_close_after_a_quote_inside_their_content_are_unparseable(self, arguments):
        """Single-quoted arguments that never close, read with a quote inside the content taken for a string's end (a quote
        before a colon: `'if x == 'y':`), are cut off, never run, wherever the text stops: read on, a write ran with its
        content cut (`if x == 'y':`)."""
        call = only(native(("write_file", arguments)))
        assert isinstance(call, BrokenCall) and call.problem == "unparseable", call
        assert call.detail.startswith("the arguments end in the middle of a value, as if cut off (")

    @pytest.mark.parametrize(
        ("tool", "arguments", "key"),
        [
            ("write_file", "{'path': 'b.py', 'content': 'd = {'name': 'x', 'path': 'a.py'}\\n'}", "path"),
            ("write_file", "{'path': 'b.js', 'content': 'x', 'path': 'a.py'}", "path"),
            ("write_file", "{path: 'b.js', content: 'x', path: 'a.py'}", "path"),
            ("run_check", "{'x': 1, 'x': 2}", "x"),
        ],
        ids=["the-contents-own-keys", "a-key-after-the-content", "bare-keys", "a-tool-with-no-required-parameters"],
    )
    def test_json5_like_arguments_that_name_a_key_twice_are_unparseable(self, tool, arguments, key):
        """JSON5-like arguments that, read loosely or repaired, name a key twice are unparseable, never run: a single-quoted
        content's own `'path': 'a.py'` was read as a key, the last one won, and a write went to another file, its content cut."""
        call = only(native((tool, arguments)))
        assert isinstance(call, BrokenCall) and (call.name, call.problem) == (tool, "unparseable"), call
        assert f"names the key {key!r} twice" in call.detail, call

    @pytest.mark.parametrize(
        ("tool", "arguments", "expected"),
        [
            ("edit_file", '{"path": "a.py", "old": "x", "new": "f("old", "new")"}', {"path": "a.py", "old": "x", "new": 'f("old", "new")'}),
            ("write_file", '{"path": "a.py", "content": "f("path", "path")"}', {"path": "a.py", "content": 'f("path", "path")'}),
        ],
        ids=["a-call-of-the-arguments-names", "a-key-name-twice"],
    )
    def test_double_quoted_arguments_whose_content_quotes_a_key_name_unescaped_still_run(self, tool, arguments, expected):
        """Double-quoted arguments whose content holds a key's name in unescaped double quotes, not followed by a colon
        (`f("old", "new")`), still run as repaired: the name is the content's word, no key named twice."""
        call = only(native((tool, arguments)))
        assert call == ToolCall(tool, expected, id="call_0", source="native"), call

    def test_json_arguments_that_name_a_key_twice_still_run_with_the_last(self):
        """Strict JSON arguments that name a key twice run as JSON reads them, with the last one: no quote of a double-quoted
        string can be taken for its end, so the keys are the model's own."""
        call = only(native(("write_file", '{"path": "b.js", "content": "x", "path": "a.py"}')))
        assert call == ToolCall("write_file", {"path": "a.py", "content": "x"}, id="call_0", source="native")

    @pytest.mark.parametrize(
        ("tool", "arguments", "expected"),
        [
            ("write_file", "{'path': 'a.txt', 'content': 'it\\'s done'}", {"path": "a.txt", "content": "it's done"}),
            ("write_file", "{'path': 'a.txt', 'content': \"it's done\"}", {"path": "a.txt", "content": "it's done"}),
            ("write_file", "{'path': 'a.py', 'content': 'print(\"hi\")'}", {"path": "a.py", "content": 'print("hi")'}),
            ("write_file", "{'content': 'done', 'path': 'a.txt'", {"path": "a.txt", "content": "done"}),
            ("search", "{'pattern': 'helo', 'path': None}", {"pattern": "helo"}),
            ("write_file", "{path: 'a.txt', content: 'x'}", {"path": "a.txt", "content": "x"}),
            ("read_file", "{'path': 'a.py'}\nNext I will run:", {"path": "a.py"}),
            ("read_file", "{'path': 'a.py'}\nI'll read it", {"path": "a.py"}),
            ("write_file", '{"path": "a.txt", "content": "it\'s done"', {"path": "a.txt", "content": "it's done"}),
        ],
        ids=[
            "escaped-apostrophe", "apostrophe-in-double-quotes", "double-quotes-in-single", "lacking-its-brace",
            "python-none", "unquoted-keys", "words-ending-in-a-colon", "words-with-an-apostrophe", "json-lacking-its-brace",
        ],
    )
    def test_whole_json5_like_arguments_still_run(self, tool, arguments, expected):
        """Single-quoted arguments whose every value is whole run as repaired, apostrophes and Python's None included."""
        assert only(native((tool, arguments))) == ToolCall(tool, expected, id="call_0")

    def test_a_bare_apostrophe_inside_a_single_quoted_string_is_no_cut(self):
        """`'it's done'`: the quote inside a word does not end the string, so the arguments are whole and run as repaired."""
        assert isinstance(only(native(("write_file", "{'path': 'a.txt', 'content': 'it's done'}"))), ToolCall)

    def test_argument_objects_one_after_another_are_a_call_each(self):
        """A server that ran two calls' arguments together (`{...}{...}`): each object is a call, as in a written block,
        where repair kept only the last and the first edit silently never ran."""
        first, second = '{"path": "a.py", "old": "x", "new": "y"}', '{"path": "a.py", "old": "z", "new": "w"}'
        for arguments in (first + second, f"{first}\n{second}"):
            calls = native(("edit_file", arguments))
            assert [call.arguments["new"] for call in calls if isinstance(call, ToolCall)] == ["y", "w"], calls
            assert len({call.id for call in calls}) == 2, calls

    @pytest.mark.parametrize(
        ("tool", "arguments", "expected"),
        [
            ("read_file", '{}{"path": "a.py"}', {"path": "a.py"}),
            ("read_file", '{"path": "a.py"}{}', {"path": "a.py"}),
            ("read_file", '{"path": "a.py"}{"path": "a.py"}', {"path": "a.py"}),
            ("run_check", "{}{}", {}),
            ("read_file", '{}{"path": "a.py"', {"path": "a.py"}),
        ],
        ids=["empty-first", "empty-last", "sent-twice", "all-empty", "empty-first-brace-missing"],
    )
    def test_a_servers_echo_of_the_arguments_is_no_call_of_its_own(self, tool, arguments, expected):
        """An empty object beside the arguments (a stream's opening `{}`, as Bedrock sends) or the same object sent again
        (a stream that repeats the whole arguments) is one call, as before, not a second one run on nothing or twice."""
        assert native((tool, arguments)) == [ToolCall(tool, expected, id="call_0")]

    @pytest.mark.parametrize(
        ("tool", "arguments"),
        [
            ("write_file", '{"path": "a.py", "content": "x = 1"}{"path": "b.py", "content": "x = '),
            ("edit_file", '{"path": "a.py", "old": "x", "new": "y"}{"path": "a.py", "old": "z", "new": '),
            ("edit_file", '{"path": "a.py", "old": "x", "new": "y"}\n{"path": "a.py", "old": "z", "new": "w'),
        ],
        ids=["inside-a-string", "before-a-value", "on-the-next-line"],
    )
    def test_argument_objects_one_after_another_the_last_cut_off_run_but_the_last(self, tool, arguments):
        """Argument objects one after another whose last stops mid-value: the whole ones before it run, as in a written
        block, and the last is broken, not run with a value the repair made up or cut in half."""
        *whole, last = native((tool, arguments))
        assert len(whole) == 1 and isinstance(whole[0], ToolCall) and whole[0].arguments["path"] == "a.py", whole
        assert isinstance(last, BrokenCall) and last.problem == "unparseable", last
        assert last.detail.startswith("the arguments end in the middle of a value, as if cut off (")

    def test_a_whole_argument_object_before_one_lacking_its_brace_runs_too(self):
        """Argument objects one after another, the last lacking only its closing brace: both run, the last repaired, not
        merged by the repair into the last alone (the first write silently never ran)."""
        calls = native(("write_file", '{"path":"a.py","content":"x"}{"path":"b.py","content":"y"'))
        assert [(type(call), call.arguments) for call in calls] == [
            (ToolCall, {"path": "a.py", "content": "x"}),
            (ToolCall, {"path": "b.py", "content": "y"}),
        ], calls

    @pytest.mark.parametrize(
        ("arguments", "contents"),
        [
            ("{'path': 'a.py', 'content': 'x'}{'path': 'a.py', 'content': 'y'}", ["x", "y"]),
            ("{'path': 'a.py', 'content': 'x'}\n{'path': 'a.py', 'content': 'y'}", ["x", "y"]),
            ("{'path': 'a.py', 'content': 'x'}; {'path': 'a.py', 'content': 'y'}", ["x", "y"]),
            ("{'path': 'a.py', 'content': 'it's'}{'path': 'a.py', 'content': 'y'}", ["it's", "y"]),
            ("{'path': 'a.py', 'content': 'x'}{\"path\": \"a.py\", \"content\": \"y\"}", ["x", "y"]),
            ("{path: 'a.py', content: 'x'}{path: 'a.py', content: 'y\n'}", ["x", "y\n"]),
            ("{'path': 'a.py', 'content': 'x'}{'content': 'y', 'path': 'a.py'", ["x", "y"]),
            ("{'path': 'a.py', 'content': 'x'}{'path': 'a.py', 'content': 'y'}{'path': 'a.py', 'content': 'z'}", ["x", "y", "z"]),
        ],
        ids=["together", "a-line-each", "semicolon", "apostrophe", "then-double-quoted", "unquoted-keys", "last-lacking-its-brace", "three"],
    )
    def test_single_quoted_argument_objects_one_after_another_are_a_call_each(self, arguments, contents):
        """Single-quoted argument objects one after another are a call each, as double-quoted ones are, not merged by the
        repair into the last (the first write silently never ran) or misread at an apostrophe."""
        calls = native(("write_file", arguments))
        assert [(type(call), call.arguments.get("content")) for call in calls] == [(ToolCall, content) for content in contents], calls

    @pytest.mark.parametrize(
        "arguments",
        [
            "{'path': 'a.py', 'content': 'x = 1'}{'path': 'b.py', 'content': 'y = ",
            "{'path': 'a.py', 'content': 'x = 1'}\n{'path': 'b.py', 'content': ",
            "{'path': 'a.py', 'content': 'x = 1'}{'path': 'b.py', 'content'",
        ],
        ids=["inside-a-string", "before-a-value", "after-a-key"],
    )
    def test_single_quoted_argument_objects_the_last_cut_off_run_but_the_last(self, arguments):
        """Single-quoted argument objects one after another whose last stops mid-value: the whole one before it runs, as
        with double quotes, and the last is broken, not run cut in half."""
        whole, last = native(("write_file", arguments))
        assert whole == ToolCall("write_file", {"path": "a.py", "content": "x = 1"}, id="call_0"), whole
        assert isinstance(last, BrokenCall) and last.problem == "unparseable", last
        assert last.detail.startswith("the arguments end in the middle of a value, as if cut off (")

    @pytest.mark.parametrize(
        ("arguments", "contents"),
        [
            ("{'path': 'a.py', 'content': 's = {'a', 'b'}'}{'path': 'b.py', 'content': 'y'}", ["s = {'a', 'b'}", "y"]),
            ("{'path': 'a.py', 'content': 'x = [{'id': 1}]'}\n{'path': 'b.py', 'content': 'y'}", ["x = [{'id': 1}]", "y"]),
            ('{"path": "a.py", "content": "print("hi")"}{"path": "b.py", "content": "print("y")"}', ['print("hi")', 'print("y")']),
        ],
        ids=["single-quoted", "single-quoted-a-line-each", "double-quoted"],
    )
    def test_argument_objects_one_after_another_holding_quotes_not_escaped_are_a_call_each(self, arguments, contents):
        """Argument objects one after another whose content holds quotes not escaped (so they do not read one by one) are
        a call each, as the repair reads them, not merged by it into the last: the first write silently never ran."""
        calls = native(("write_file", arguments))
        assert [(type(call), call.arguments.get("content")) for call in calls] == [(ToolCall, content) for content in contents], calls

    def test_arguments_that_lack_only_their_closing_brace_are_repaired(self):
        """Every value whole, the closing brace alone missing: a slip the repair mends, and the call runs."""
        call = only(native(("edit_file", '{"path": "greet.py", "old": "helo", "new": "hello"')))
        assert call == ToolCall("edit_file", {"path": "greet.py", "old": "helo", "new": "hello"}, id="call_0")

    @pytest.mark.parametrize(
        ("arguments", "content"),
        [
            ("{'path': 'a.txt', 'content': 'it's done'}", "it's done"),
            ("{'path': 'a.txt', 'content': 'it's'}", "it's"),
            ("{path: 'a.txt', content: 'it's done'}", "it's done"),
            ("{'path': 'a.txt', 'content': 'x = 1\\n'}", "x = 1\n"),
            ("{'path': 'a.txt', 'content': 'it's done'}\nI'll check it next.", "it's done"),
        ],
        ids=["apostrophe", "apostrophe-at-the-end", "unquoted-keys", "last-newline", "words-after"],
    )
    def test_one_line_single_quoted_arguments_are_written_as_sent(self, arguments, content):
        """One-line single-quoted arguments run with every string exactly as the model wrote it: an apostrophe inside a
        word does not end it (the repair wrote `it's done'`), nor is its last line break dropped."""
        assert only(native(("write_file", arguments))) == ToolCall("write_file", {"path": "a.txt", "content": content}, id="call_0")

    def test_single_quoted_code_with_a_quote_before_a_bracket_is_not_cut_there(self):
        """A single-quoted string of code whose quote stands before a bracket (`{1: 'a', 2: 'b'}`) is not read as ending
        there, the object closed early and the rest dropped: such arguments are repaired as before."""
        arguments = "{'path': 'a.py', 'content': 'd = {1: 'a', 2: 'b'}'}"
        assert only(native(("write_file", arguments))) == ToolCall("write_file", {"path": "a.py", "content": "d = {1: 'a', 2: 'b'}"}, id="call_0")

    @pytest.mark.parametrize(
        ("arguments", "expected"),
        [
            ('{"path": "a.py", "content": "x = 1\\n"', "x = 1\n"),
            ('{"path": "a.py", "content": "x = 1\n"', "x = 1\n"),
            ('{"path": "a.py", "content": "x = 1\r\n"', "x = 1\r\n"),
            ('{"path": "a.py", "content": "x = 1\\n\\n"', "x = 1\n\n"),
            ('{"path": "a.py", "content": "x = 1\\n",', "x = 1\n"),
            ('{"path": "a.py", "content": "x = 1\n"} Now I run the check.', "x = 1\n"),
            ("{'path': 'a.py', 'content': \"x = 1\\n\"", "x = 1\n"),
        ],
        ids=["escaped", "raw", "raw-crlf", "two", "trailing-comma", "words-after", "single-quoted-keys"],
    )
    def test_arguments_lacking_only_their_closing_brace_keep_a_files_last_newline(self, arguments, expected):
        """Arguments whose every value is whole and only the closing brace is missing (or words follow it) run with the
        file's last line break, which the repair dropped."""
        call = only(native(("write_file", arguments)))
        assert call == ToolCall("write_file", {"path": "a.py", "content": expected}, id="call_0"), call

    @pytest.mark.parametrize(
        "arguments",
        [
            "{'path': 'a.py', 'content': 't = {'a': 'b'}",
            "{'path': 'a.py', 'content': 't = {'a', 'b'}",
            "{'path': 'a.py', 'content': 't = {'a': 'b'}}",
            '{"path": "a.py", "content": "d = {"k": 1}',
            '{"path": "a.py", "content": "print("hi")',
            '{"path": "a.py", "content": "d = {"k": 1}\\nx = 2}',
            '{"path": "a.py", "content": "fmt = f"{x}',
        ],
        ids=[
            "single-quoted", "single-quoted-set", "single-quoted-then-a-brace", "double-quoted", "double-quoted-never-closed",
            "double-quoted-a-line-after", "double-quoted-a-brace-right-after-a-quote",
        ],
    )
    def test_arguments_cut_after_a_bracket_of_their_content_are_unparseable(self, arguments):
        """Arguments whose content holds a quote taken for a string's end, cut right after the content's own `}` (which the
        reading took for the object's: `'t = {'a': 'b'}`), or never closed, are cut off, never run: repaired, a write ran with
        `t = {'a': 'b'` or `d = {"k": 1}`, the rest of the file never written."""
        call = only(native(("write_file", arguments)))
        assert isinstance(call, BrokenCall) and call.problem == "unparseable", call
        assert call.detail.startswith("the arguments end in the middle of a value, as if cut off ("), call

    @pytest.mark.parametrize(
        "arguments",
        [
            "{'path': 'a.py', 'content': 't = {'a': 'b'}\\nu = {'c': 'd'}",
            "{'path': 's.py', 'content': 's = {'a', 'b'}\\nprint(s",
            "{'path': 'a.py', 'content': 'CONFIG = {'debug': False}\\nPORT = 80",
            "{'path': 'a.py', 'content': 'ITEMS = [{'id': 1}, {'id': 2}",
            "{'path': 'a.py', 'content': 'ITEMS = [{'id': 1}, {'id': 2}]",
        ],
        ids=["cut-after-a-second-brace", "cut-a-line-after-a-brace", "cut-mid-line", "cut-in-a-list", "cut-after-a-list"],
    )
    def test_arguments_cut_lines_after_a_bracket_of_their_content_are_unparseable(self, arguments):
        """Single-quoted arguments whose content's first `}` was taken for the object's, cut further on in the content (no
        `'}` of the arguments after it), are cut off, never run: repaired, a write ran with `t = {'a': 'b` alone."""
        call = only(native(("write_file", arguments)))
        assert isinstance(call, BrokenCall) and call.problem == "unparseable", call
        assert call.detail.startswith("the arguments end in the middle of a value, as if cut off ("), call

    @pytest.mark.parametrize(
        "content", ['print("', 'x = "', 'd = {"', 'v = d["', 'print(f"', "s = f(x, \"", "o = {b: \""], ids=str.strip
    )
    def test_arguments_cut_right_after_a_quote_of_their_content_are_unparseable(self, content):
        """Double-quoted arguments whose content's quote is not escaped, cut right after the first such quote (`"print("`),
        are cut off, never run: every value read whole, only the brace missing, a write ran with `print(` alone."""
        call = only(native(("write_file", '{"path": "a.py", "content": "' + content), finish_reason="stop"))
        assert isinstance(call, BrokenCall) and call.problem == "unparseable", call
        assert call.detail.startswith("the arguments end in the middle of a value, as if cut off ("), call

    @pytest.mark.parametrize("content", ["x = 1\\n", "if x:", "f(a)", "a.py", "x = a + b", "key:"])
    def test_double_quoted_arguments_lacking_only_their_brace_still_run(self, content):
        """Double-quoted arguments lacking only their closing brace, their content ending as no cut one does, still run."""
        call = only(native(("write_file", '{"path": "a.py", "content": "' + content + '"'), finish_reason="stop"))
        assert call == ToolCall("write_file", {"path": "a.py", "content": json.loads('"' + content + '"')}, id="call_0")

    @pytest.mark.parametrize(
        ("arguments", "content"),
        [
            ("{'path': 'a.py', 'content': 't = {'a': 'b'}\\nu = {'c': 'd'}\\n'}", "t = {'a': 'b'}\nu = {'c': 'd'}\n"),
            ("{'path': 'a.py', 'content': 'ITEMS = [{'id': 1}, {'id': 2}]\\n'}", "ITEMS = [{'id': 1}, {'id': 2}]\n"),
            ('{"path": "a.py", "content": "v = d["k"]"}', 'v = d["k"]'),
        ],
        ids=["two-dicts", "a-list-of-dicts", "an-index"],
    )
    def test_whole_arguments_with_more_after_a_bracket_of_their_content_still_run(self, arguments, content):
        """The same arguments whole, closed after their last quote, run with exactly their content."""
        call = only(native(("write_file", arguments)))
        assert call == ToolCall("write_file", {"path": "a.py", "content": content}, id="call_0")

    @pytest.mark.parametrize(
        "arguments",
        ['{"path": "a.js", "content": "const s = "}"; f(s);"}', "{'path': 'a.py', 'content': 'x = 1'}; y = {}'}"],
        ids=["double-quoted", "single-quoted"],
    )
    def test_arguments_whose_object_a_quote_of_their_content_closes_early_are_unparseable(self, arguments):
        """Arguments whose object closes at a quote of their content not escaped (`"s = "}`), the rest of the content after
        it, are unparseable, never run: repaired, a write ran with `const s = ` alone."""
        call = only(native(("write_file", arguments)))
        assert isinstance(call, BrokenCall) and call.problem == "unparseable", call
        assert "their object closes before their end" in call.detail, call

    @pytest.mark.parametrize(
        ("arguments", "content"),
        [
            ("{'path': 'a.py', 'content': 'if x == 'y': pass'}", "if x == 'y': pass"),
            ('{"path": "a.py", "content": "print("hi")"}', 'print("hi")'),
            ('{"path": "a.py", "content": "d = {"k": 1}"}', 'd = {"k": 1}'),
        ],
        ids=["single-quoted", "double-quoted", "double-quoted-braces"],
    )
    def test_whole_arguments_whose_content_holds_quotes_not_escaped_still_run(self, arguments, content):
        """Whole arguments whose content holds quotes not escaped, its brackets balanced, run with exactly that content."""
        call = only(native(("write_file", arguments)))
        assert call == ToolCall("write_file", {"path": "a.py", "content": content}, id="call_0"), call

    def test_complete_arguments_at_the_length_limit_are_accepted(self):
        """A call whose arguments parse as they are is fine even when the answer hit the limit."""
        call = only(native(("read_file", '{"path": "a.py"}'), finish_reason="length"))
        assert isinstance(call, ToolCall)

    def test_native_calls_win_over_text(self):
        """With native calls present, JSON in the text is not parsed as more calls."""
        raw = (RawToolCall("read_file", '{"path": "a"}'),)
        text = '{"name": "read_file", "arguments": {"path": "b"}}'
        calls = parse_calls(ModelResponse(text=text, tool_calls=raw), SCHEMAS)
        assert [c.arguments for c in calls] == [{"path": "a"}]


class TestTextCalls:
    @pytest.mark.parametrize(
        "text",
        [
            'Reading it.\n```json\n{"name": "read_file", "arguments": {"path": "a.py"}}\n```',
            '```\n{"name": "read_file", "parameters": {"path": "a.py"}}\n```',
            '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>',
            '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}',
            '{"tool": "read_file", "args": {"path": "a.py"}}',
            '{"function": {"name": "read_file", "arguments": "{\\"path\\": \\"a.py\\"}"}}',
            '{"type": "function", "function": {"name": "read_file", "arguments": {"path": "a.py"}}}',
            'I will look.\n{\n  "name": "read_file",\n  "arguments": {"path": "a.py"}\n}\nDone.',
            "<function=read_file>{\"path\": \"a.py\"}</function>",
            "<tool_call>\n<function=read_file>\n<parameter=path>\na.py\n</parameter>\n</function>\n</tool_call>",
            '<|python_tag|>{"name": "read_file", "parameters": {"path": "a.py"}}',
            '[TOOL_CALLS][{"name": "read_file", "arguments": {"path": "a.py"}}]',
            'I will read the file first. {"name": "read_file", "arguments": {"path": "a.py"}}',
        ],
        ids=[
            "json-fence",
            "plain-fence-parameters",
            "tool-call-tag",
            "unclosed-tag",
            "tool-args",
            "function-string-arguments",
            "openai-shape",
            "bare-multiline",
            "function-tag-json",
            "function-tag-parameters",
            # Left in the text when the server does not parse them (they were no_tool_call).
            "llama3-python-tag",
            "mistral-tool-calls",
            "after-a-sentence",
        ],
    )
    def test_each_text_shape_is_a_call(self, text):
        """Every accepted way of writing a call in text gives the same ToolCall, marked as text."""
        assert only(written(text)) == ToolCall("read_file", {"path": "a.py"}, source="text")

    def test_several_tags_are_several_calls(self):
        """Several <tool_call> tags give one call each, in order."""
        text = (
            '<tool_call>{"name": "read_file", "arguments": {"path": "a"}}</tool_call>\n'
            '<tool_call>{"name": "run_check", "arguments": {}}</tool_call>'
        )
        assert [c.name for c in written(text)] == ["read_file", "run_check"]

    def test_a_list_is_several_calls(self):
        """A JSON list of call objects is several calls."""
        text = '```json\n[{"name": "read_file", "arguments": {"path": "a"}}, {"name": "run_check"}]\n```'
        assert written(text) == [
            ToolCall("read_file", {"path": "a"}, source="text"),
            ToolCall("run_check", {}, source="text"),
        ]

    def test_several_bare_lines_are_several_calls(self):
        """One call object per line gives one call per line."""
        text = '{"name": "read_file", "arguments": {"path": "a"}}\n{"name": "list_dir", "arguments": {}}'
        assert [c.name for c in written(text)] == ["read_file", "list_dir"]

    def test_json_that_is_not_a_call_is_ignored(self):
        """An example config in a fence, or a {"name": ...} that names no tool, is not a call."""
        text = (
            'Here is the config:\n```json\n{"name": "app", "version": "1.0", "arguments": []}\n```\n'
            '{"name": "my-package"}\n[1, 2, 3]\n'
            'Inside a sentence, {"name": "app", "arguments": {}} and {"name": "bash", "arguments": {"cmd": "ls"}} '
            "name no tool of ours."
        )
        assert written(text) == []

    def test_code_fence_of_another_language_is_not_a_call(self):
        """A ```python fence with dict literals is not a call."""
        assert written('```python\nconfig = {"name": "read_file", "size": 3}\n```') == []

    def test_prose_without_calls_gives_nothing(self):
        """Plain prose yields no calls."""
        assert written("I think the bug is in the parser. {not json}") == []

    def test_unknown_tool_in_text_is_reported(self):
        """A call-shaped object naming no tool is an unknown_tool BrokenCall from the text."""
        call = only(written('<tool_call>{"name": "delete_repo", "arguments": {}}</tool_call>'))
        assert isinstance(call, BrokenCall) and (call.problem, call.source) == ("unknown_tool", "text")

    def test_empty_name_in_text_is_reported(self):
        """A call object with an empty name is an empty_tool_name BrokenCall."""
        call = only(written('```json\n{"name": "", "arguments": {"path": "a"}}\n```'))
        assert isinstance(call, BrokenCall) and call.problem == "empty_tool_name"

    def test_missing_parameter_in_text_is_invalid(self):
        """A text call missing a required parameter is invalid."""
        call = only(written('<tool_call>{"name": "write_file", "arguments": {"path": "a"}}</tool_call>'))
        assert isinstance(call, BrokenCall) and call.problem == "invalid"
        assert call.detail == "missing required parameter 'content'"

    def test_unreadable_tag_is_unparseable(self):
        """A <tool_call> tag that holds no call object is an unparseable BrokenCall, not silence."""
        call = only(written("<tool_call>read the file a.py please</tool_call>"))
        assert isinstance(call, BrokenCall) and call.problem == "unparseable"

    def test_broken_tag_json_is_repaired(self):
        """A tag whose JSON misses a closing brace is repaired when the call then fits."""
        text = '<tool_call>{"name": "read_file", "arguments": {"path": "a.py"}</tool_call>'
        assert only(written(text)) == ToolCall("read_file", {"path": "a.py"}, source="text")

    @pytest.mark.parametrize(
        "wrap",
        [
            lambda call: "I will write the README.\n```json\n" + json.dumps(call) + "\n```\n",
            lambda call: "```json\n" + json.dumps(call, indent=2) + "\n```",
            lambda call: "<tool_call>\n```json\n" + json.dumps(call) + "\n```\n</tool_call>",
        ],
        ids=["json-fence", "pretty-printed", "fence-in-tag"],
    )
    def test_a_code_fence_inside_a_string_does_not_cut_the_call(self, wrap):
        """A ``` in the content of a call written in a fence is content: the call arrives whole, not cut there and repaired."""
        content = "# Demo\n\nRun it:\n\n```bash\npython app.py\n```\n\nMore docs below.\n"
        call = {"name": "write_file", "arguments": {"path": "README.md", "content": content}}
        assert only(written(wrap(call))) == ToolCall("write_file", call["arguments"], source="text")

    def test_a_python_dict_call_with_a_double_quote_in_a_string_still_runs(self):
        """A Python-style call whose 'string' holds a lone " (27" wide) is repaired and runs, as before the
        fence check: that " is no JSON string the fence could have cut."""
        text = "```json\n{'name': 'write_file', 'arguments': {'path': 'notes.txt', 'content': 'The screen is 27\" wide.'}}\n```"
        assert only(written(text)) == ToolCall("write_file", {"path": "notes.txt", "content": 'The screen is 27" wide.'}, source="text")

    def test_calls_after_a_fence_with_a_code_fence_inside_are_found(self):
        """The fence ends at the ``` after the JSON, so a second fenced call after it is found too."""
        edit = {"name": "edit_file", "arguments": {"path": "R.md", "old": "TBD", "new": "```\nrun\n```"}}
        text = "```json\n" + json.dumps(edit) + "\n```\nthen\n```json\n" + '{"name": "run_check"}' + "\n```"
        assert written(text) == [ToolCall("edit_file", edit["arguments"], source="text"), ToolCall("run_check", {}, source="text")]

    @pytest.mark.parametrize("tagged", [False, True], ids=["json-fence", "fence-in-tag"])
    def test_invalid_json_cut_by_a_code_fence_inside_a_string_is_not_repaired(self, tagged):
        """Invalid JSON whose string holds a ```: repaired at that ```, the call would run with its text cut, so it is broken."""
        text = '```json\n{"name": "write_file", "arguments": {"path": "R.md", "content": "a\\n```bash\\nx\\n```"}\n```'
        call = only(written(f"<tool_call>{text}</tool_call>" if tagged else text))
        assert isinstance(call, BrokenCall) and (call.name, call.problem) == ("write_file", "unparseable")
        assert "```" in call.detail and "valid JSON" in call.detail

    def test_text_call_cut_at_the_length_limit_is_unparseable(self):
        """A written call cut off at the length limit is a BrokenCall with the tool's name."""
        text = 'Writing:\n<tool_call>\n{"name": "write_file", "arguments": {"path": "a.py", "content": "def f('
        call = only(written(text, finish_reason="length"))
        assert isinstance(call, BrokenCall)
        assert (call.name, call.problem, call.detail) == ("write_file", "unparseable", "cut off at the length limit")

    @pytest.mark.parametrize("form", ["bare", "tagged", "fenced"])
    def test_a_written_call_that_ends_mid_value_is_unparseable(self, form):
        """A written call whose JSON stops where a value was due is a BrokenCall with its tool's name, not an edit
        with a value the repair made up, in each form a call is written in."""
        body = '{"name": "edit_file", "arguments": {"path": "greet.py", "old": "helo", "new": '
        text = {"bare": f"I will fix it.\n{body}", "tagged": f"<tool_call>{body}</tool_call>", "fenced": f"```json\n{body}\n```"}[form]
        call = only(written(text))
        assert isinstance(call, BrokenCall) and (call.name, call.problem) == ("edit_file", "unparseable"), call
        assert "end in the middle of a value" in call.detail

    @pytest.mark.parametrize("form", ["bare", "tagged", "fenced"])
    def test_a_written_call_with_json5_like_arguments_cut_inside_a_string_is_unparseable(self, form):
        """A written call whose single-quoted arguments stop inside a string is a BrokenCall with its tool's name, not a
        file written with half its content, in each form a call is written in."""
        body = "{\"name\": \"write_file\", \"arguments\": {'path': 'a.py', 'content': 'print(1"
        text = {"bare": f"I will write it.\n{body}", "tagged": f"<tool_call>{body}</tool_call>", "fenced": f"```json\n{body}\n```"}[form]
        call = only(written(text))
        assert isinstance(call, BrokenCall) and (call.name, call.problem) == ("write_file", "unparseable"), call
        assert "end in the middle of a value" in call.detail

    def test_a_written_python_dict_call_cut_inside_a_string_is_unparseable(self):
        """A call written wholly as a Python dict that stops inside a string is broken, not run with half its content."""
        call = only(written("<tool_call>{'name': 'write_file', 'arguments': {'path': 'a.py', 'content': 'print(1</tool_call>"))
        assert isinstance(call, BrokenCall) and (call.name, call.problem) == ("write_file", "unparseable"), call
        assert "end in the middle of a value" in call.detail

    @pytest.mark.parametrize("tagged", [False, True], ids=["function-tag", "in-a-tool-call-tag"])
    def test_a_parameter_value_the_answer_ends_inside_is_unparseable(self, tagged):
        """A `<function=…>` call whose answer ends inside its last `<parameter=…>` value, neither closed, is broken, not
        a file written with half its content."""
        body = "<function=write_file>\n<parameter=path>\na.py\n</parameter>\n<parameter=content>\ndef f(x):\n    return"
        call = only(written(f"<tool_call>\n{body}" if tagged else body))
        assert isinstance(call, BrokenCall) and (call.name, call.problem) == ("write_file", "unparseable"), call
        assert "end in the middle of a value" in call.detail

    @pytest.mark.parametrize(
        "text",
        [
            "<function=write_file>\n<parameter=path>\na.py\n</parameter>\n<parameter=content>\nx = 1\n</parameter>",
            "<function=write_file>\n<parameter=path>\na.py\n<parameter=content>\nx = 1\n</function>",
            "<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n<parameter=content>\nx = 1\n</tool_call>",
        ],
        ids=["function-not-closed", "parameters-not-closed", "only-the-tool-call-tag-closed"],
    )
    def test_a_parameter_value_closed_by_any_tag_still_runs(self, text):
        """A `<parameter=…>` value ended by its own closing tag, the function's or the `<tool_call>`'s is whole, and runs."""
        assert only(written(text)) == ToolCall("write_file", {"path": "a.py", "content": "x = 1"}, source="text")

    @pytest.mark.parametrize("form", ["tagged", "fenced"])
    def test_a_second_call_that_ends_mid_value_is_unparseable(self, form):
        """Two calls a line each, the second stopping where a value was due: no edit runs with a value the repair
        made up (the block's own error is only the data after the first call)."""
        first = '{"name": "read_file", "arguments": {"path": "greet.py"}}'
        second = '{"name": "edit_file", "arguments": {"path": "greet.py", "old": "helo", "new": '
        body = f"{first}\n{second}"
        text = {"tagged": f"<tool_call>{body}</tool_call>", "fenced": f"```json\n{body}\n```"}[form]
        calls = written(text)
        assert not [call for call in calls if isinstance(call, ToolCall) and call.name == "edit_file"], calls
        edit = [call for call in calls if call.name == "edit_file"]
        assert len(edit) == 1 and edit[0].problem == "unparseable" and "end in the middle of a value" in edit[0].detail, calls

    @pytest.mark.parametrize("form", ["bare", "tagged", "fenced", "same-line"])
    def test_a_whole_call_before_one_lacking_its_brace_runs_too(self, form):
        """Two calls written one after another, the second lacking only its closing brace: both run, the second repaired,
        not merged by the repair into the second alone (the first write silently never ran)."""
        first = '{"name":"write_file","arguments":{"path":"a.py","content":"x"}}'
        second = '{"name":"write_file","arguments":{"path":"b.py","content":"y"}'
        body = f"{first}\n{second}"
        text = {
            "bare": body, "tagged": f"<tool_call>\n{body}\n</tool_call>", "fenced": f"```json\n{body}\n```", "same-line": f"{first}; {second}"
        }[form]
        assert [call.arguments["path"] for call in written(text) if isinstance(call, ToolCall)] == ["a.py", "b.py"], written(text)

    @pytest.mark.parametrize("between", ["; ", ", ", " ;", " ", ""])
    @pytest.mark.parametrize("slip", ["", ","], ids=["whole", "trailing-comma"])
    def test_a_second_bare_call_on_the_line_cut_off_is_unparseable(self, between, slip):
        """Two bare calls on one line, the second stopping inside a string: the first runs (mended if need be) and the
        second is a BrokenCall saying it was cut off, as on a line of its own, not dropped without a word."""
        first = '{"name":"read_file","arguments":{"path":"a.py"%s}}' % slip
        second = '{"name":"write_file","arguments":{"path":"b.py","content":"def f('
        read, write = written(f"I will do both.\n{first}{between}{second}")
        assert read == ToolCall("read_file", {"path": "a.py"}, source="text"), read
        assert isinstance(write, BrokenCall) and (write.name, write.problem) == ("write_file", "unparseable"), write
        assert write.detail.startswith("the arguments end in the middle of a value, as if cut off (")

    @pytest.mark.parametrize(
        "after",
        ["", "\nThen I run the check.", "\n{'name': 'read_file', 'arguments': {'path': 'a.py'}}", "; {'name': 'read_file', 'arguments': {'path': 'a.py'}}"],
        ids=["alone", "prose-after", "call-next-line", "call-same-line"],
    )
    @pytest.mark.parametrize(
        "content", ["def f():\n    return 1", "# it's\nx = 'a'\n", 'say("hi")\nok = True'], ids=["code", "apostrophes", "double-quotes"]
    )
    def test_a_json5_like_bare_call_with_raw_newlines_in_a_string_is_read_whole(self, after, content):
        """A single-quoted bare call after prose whose string holds raw line breaks is read whole, every character of
        it (an apostrophe, a double quote, the last line break), as the double-quoted one is, not its first line
        refused as cut off."""
        text = "I will write it.\n{'name': 'write_file', 'arguments': {'path': 'a.py', 'content': '" + content + "'}}" + after
        calls = written(text)
        assert calls[0] == ToolCall("write_file", {"path": "a.py", "content": content}, source="text"), calls
        assert [call.name for call in calls] == ["write_file"] + (["read_file"] if "read_file" in after else []), calls

    @pytest.mark.parametrize("form", ["bare", "after-prose", "tagged", "fenced"])
    @pytest.mark.parametrize(
        "call",
        [
            "{'name': 'write_file', 'arguments': {'path': 'a.txt', 'content': 'it's done'}}",
            "{\"name\": \"write_file\", \"arguments\": {'path': 'a.txt', 'content': 'it's done'}}",
        ],
        ids=["single-quoted", "single-quoted-arguments"],
    )
    def test_a_one_line_single_quoted_call_is_written_as_sent(self, form, call):
        """A written call on one line whose single-quoted string holds an apostrophe writes that string exactly, in
        each form a call is written in (the repair wrote `it's done'}`)."""
        text = {"bare": call, "after-prose": f"I will write it.\n{call}", "tagged": f"<tool_call>{call}</tool_call>", "fenced": f"```json\n{call}\n```"}[form]
        assert only(written(text)) == ToolCall("write_file", {"path": "a.txt", "content": "it's done"}, source="text")

    @pytest.mark.parametrize(
        ("form", "newline"),
        [("bare", "\\n"), ("after-prose", "\\n"), ("tagged", "\\n"), ("fenced", "\\n"), ("tagged", "\n"), ("fenced", "\n")],
        ids=["bare", "after-prose", "tagged", "fenced", "tagged-raw", "fenced-raw"],
    )
    def test_a_written_call_lacking_its_closing_brace_keeps_a_files_last_newline(self, form, newline):
        """A written call whose every value is whole and only its closing brace is missing writes the file's last
        line break, which the repair dropped, in each form a call is written in (a bare one whose raw line break
        spans lines is cut off, as its first line alone says)."""
        call = '{"name": "write_file", "arguments": {"path": "a.py", "content": "x = 1' + newline + '"}'
        text = {"bare": call, "after-prose": f"I will write it.\n{call}", "tagged": f"<tool_call>{call}</tool_call>", "fenced": f"```json\n{call}\n```"}[form]
        assert only(written(text)) == ToolCall("write_file", {"path": "a.py", "content": "x = 1\n"}, source="text")

    def test_a_json5_like_bare_call_cut_inside_a_string_over_lines_is_still_cut_off(self):
        """A single-quoted bare call whose string holds a raw line break and never closes is still cut off."""
        call = only(written("I will write it.\n{'name': 'write_file', 'arguments': {'path': 'a.py', 'content': 'def f():\n    return"))
        assert isinstance(call, BrokenCall) and call.problem == "unparseable" and "end in the middle of a value" in call.detail

    def test_a_json5_like_bare_call_cut_inside_a_string_before_a_call_is_not_read_as_one(self):
        """A single-quoted bare call cut inside a string, then a call on the next line: the first is cut off and the next
        runs, not the two read as one call whose string runs into the next."""
        text = "{'name': 'write_file', 'arguments': {'path': 'a.py', 'content': 'print(1\n{\"name\": \"write_file\", \"arguments\": {'path': 'b.py', 'content': 'x\ny'}}"
        cut, whole = written(text)
        assert isinstance(cut, BrokenCall) and "end in the middle of a value" in cut.detail, cut
        assert whole == ToolCall("write_file", {"path": "b.py", "content": "x\ny"}, source="text"), whole

    def test_json5_like_bare_calls_a_line_each_one_lacking_its_brace_stay_two(self):
        """Single-quoted bare calls a line each, the first lacking its closing brace, stay two calls, not read as one."""
        text = "{'name': 'read_file', 'arguments': {'path': 'a.py'}\n{'name': 'read_file', 'arguments': {'path': 'b.py'}}"
        assert [call.arguments["path"] for call in written(text)] == ["a.py", "b.py"]

    @pytest.mark.parametrize(
        "text",
        [
            '{"name": "write_file", "arguments": {"path": "a.py", "content": "print("hi")"}}'
            '{"name": "write_file", "arguments": {"path": "b.py", "content": "print("y")"}}',
            "<tool_call>\n{'name': 'write_file', 'arguments': {'path': 'a.py', 'content': 's = {'a', 'b'}'}}\n"
            "{'name': 'write_file', 'arguments': {'path': 'b.py', 'content': 'y'}}\n</tool_call>",
        ],
        ids=["double-quoted", "single-quoted-tagged"],
    )
    def test_calls_one_after_another_holding_quotes_not_escaped_are_each_made(self, text):
        """Calls one after another whose content holds quotes not escaped (so they do not read one by one) are each made,
        as the repair reads them, not merged by it into the last: the first write silently never ran."""
        assert [(type(call), call.arguments.get("path")) for call in written(text)] == [(ToolCall, "a.py"), (ToolCall, "b.py")]

    @pytest.mark.parametrize("form", ["tagged", "tagged-one-line", "fenced", "same-line", "after-the-python-tag"])
    @pytest.mark.parametrize(
        "second",
        [
            "{'name': 'write_file', 'arguments': {'path': 'a.py', 'content': 'y'}}",
            "{'name': 'write_file', 'arguments': {'path': 'a.py', 'content': 'it's y'}}",
            '{"name": "write_file", "arguments": {"path": "a.py", "content": "y"}}',
        ],
        ids=["same-keys", "apostrophe", "double-quoted"],
    )
    def test_single_quoted_calls_one_after_another_are_each_made(self, form, second):
        """Single-quoted calls one after another in one tag or fence, or on one line, are each made, as double-quoted ones
        are: the repair merged them into the last (the first write silently never ran)."""
        first = "{'name': 'write_file', 'arguments': {'path': 'a.py', 'content': 'x'}}"
        text = {
            "tagged": f"<tool_call>\n{first}\n{second}\n</tool_call>",
            "tagged-one-line": f"<tool_call>{first}{second}</tool_call>",
            "fenced": f"```json\n{first}\n{second}\n```",
            "same-line": f"I will write both.\n{first}; {second}",
            "after-the-python-tag": f"<|python_tag|>{first}; {second}",
        }[form]
        calls = written(text)
        expected = "it's y" if "it's" in second else "y"
        assert [(type(call), call.arguments.get("content")) for call in calls] == [(ToolCall, "x"), (ToolCall, expected)], calls

    @pytest.mark.parametrize("form", ["tagged", "fenced"])
    def test_a_whole_single_quoted_call_before_one_cut_off_runs_but_the_last(self, form):
        """Single-quoted calls one after another in a block, the last stopping inside a string: the whole one runs and the
        last is broken, as with double quotes."""
        body = "{'name': 'write_file', 'arguments': {'path': 'a.py', 'content': 'x'}}\n{'name': 'write_file', 'arguments': {'path': 'b.py', 'content': 'def f("
        text = {"tagged": f"<tool_call>{body}</tool_call>", "fenced": f"```json\n{body}\n```"}[form]
        whole, cut = written(text)
        assert whole == ToolCall("write_file", {"path": "a.py", "content": "x"}, source="text"), whole
        assert isinstance(cut, BrokenCall) and (cut.name, cut.problem) == ("write_file", "unparseable"), cut
        assert "end in the middle of a value" in cut.detail

    @pytest.mark.parametrize("form", ["bare", "after-prose", "tagged", "fenced"])
    @pytest.mark.parametrize(
        "content", ["x = 1\n", "# it's\nx = 'a'\n", 'say("hi")\n'], ids=["code", "apostrophes", "double-quotes"]
    )
    @pytest.mark.parametrize("escaped", [True, False], ids=["escaped-newlines", "raw-newlines"])
    def test_a_pretty_printed_single_quoted_call_is_read(self, form, content, escaped):
        """A single-quoted call pretty-printed over several lines is read whole, every character of its strings kept, in
        each form a call is written in (bare, it was not read at all: "you did not call a tool")."""
        quoted = content.replace("\n", "\\n") if escaped else content
        call = "{\n  'name': 'write_file',\n  'arguments': {\n    'path': 'a.py',\n    'content': '" + quoted + "'\n  }\n}"
        text = {
            "bare": call, "after-prose": f"I will write it.\n{call}\nThen I run the check.",
            "tagged": f"<tool_call>\n{call}\n</tool_call>", "fenced": f"```json\n{call}\n```",
        }[form]
        assert only(written(text)) == ToolCall("write_file", {"path": "a.py", "content": content}, source="text")

    @pytest.mark.parametrize("form", ["native", "bare", "after-prose", "tagged", "fenced", "pretty-printed"])
    @pytest.mark.parametrize(
        "content",
        ["a = d['k'], b", "a = d['k'], b\n", "print('a', 'b')\n", "f('a',\n  'b')\n", "if d['k']:\n    pass\n", "x = ['a', 'b']\n"],
        ids=["bracket-then-comma", "bracket-then-comma-newline", "comma-in-a-call", "comma-at-a-line-end", "bracket-then-colon", "list"],
    )
    def test_a_single_quoted_string_with_quotes_before_a_bracket_or_comma_is_read_whole(self, form, content):
        """A single-quoted string of code whose quotes stand before a bracket or a comma that no value could be followed by
        there (`]` in an object, `, b'`) is read whole, in each form: such a call was refused as cut off, run with its
        string cut at `f('a` or without its last line break, or not read at all."""
        arguments = "{'path': 'a.py', 'content': '" + content + "'}"
        if form == "native":
            assert only(native(("write_file", arguments))) == ToolCall("write_file", {"path": "a.py", "content": content}, id="call_0")
            return
        call = "{'name': 'write_file', 'arguments': " + arguments + "}"
        if form == "pretty-printed":
            call = "{\n  'name': 'write_file',\n  'arguments': {\n    'path': 'a.py',\n    'content': '" + content + "'\n  }\n}"
        text = {
            "bare": call, "after-prose": f"I will write it.\n{call}", "tagged": f"<tool_call>{call}</tool_call>",
            "fenced": f"```json\n{call}\n```", "pretty-printed": f"I will write it.\n{call}\nThen I run the check.",
        }[form]
        assert only(written(text)) == ToolCall("write_file", {"path": "a.py", "content": content}, source="text")

    @pytest.mark.parametrize(
        "arguments",
        ["{'path': 'a.py', 'content': 'a = d['k']", "{'path': 'a.py', 'content': 'f('a',\n'b'"],
        ids=["after-a-bracket", "after-a-comma"],
    )
    def test_a_single_quoted_string_of_code_cut_off_is_not_run(self, arguments):
        """Single-quoted arguments that stop inside a string of code, after a quote no value could end at, are cut off."""
        call = only(native(("write_file", arguments)))
        assert isinstance(call, BrokenCall) and call.problem == "unparseable", call
        assert call.detail.startswith("the arguments end in the middle of a value, as if cut off (")

    def test_a_single_quoted_string_cut_off_before_a_read_on_the_next_line_is_not_read_as_one(self):
        """A single-quoted bare call cut inside a string, then a read on the next line: the first is cut off and the read
        runs, not the two read as one write whose string runs into the read (a quote before a colon still ends a string)."""
        text = "{'name': 'write_file', 'arguments': {'path': 'a.py', 'content': 'print(1\n{\"name\": \"read_file\", \"arguments\": {'path': 'b.py'}}"
        cut, read = written(text)
        assert isinstance(cut, BrokenCall) and "end in the middle of a value" in cut.detail, cut
        assert read == ToolCall("read_file", {"path": "b.py"}, source="text"), read

    @pytest.mark.parametrize(
        "second",
        ['{"name": "search", "arguments": {"pattern": "\\d+ items"}}', "{'name': 'search', 'arguments': {'pattern': 'it's'}}"],
        ids=["double-quoted-with-a-slip", "single-quoted"],
    )
    @pytest.mark.parametrize("after", ["`", "``", "\n{'", '\n{"'], ids=["fence-cut-short", "fence-cut-shorter", "single-quote-cut", "double-quote-cut"])
    def test_whole_calls_in_a_block_before_words_or_a_nameless_cut_value_all_run(self, second, after):
        """Whole calls in a fence whose closing ``` is cut short, or before a value cut off before it names a tool, all run:
        the rest is no call, and the block repaired as one value lost all but the last call, or all of them."""
        first = '{"name": "read_file", "arguments": {"path": "a.py"}}'
        calls = written(f"```json\n{first}\n{second}\n{after}")
        assert [(type(call), call.name) for call in calls] == [(ToolCall, "read_file"), (ToolCall, "search")], calls

    @pytest.mark.parametrize(
        "first",
        ["{'name': 'edit_file', 'arguments': {'path': 'a.py', 'old': 'print('a', 'b')', 'new': 'x'}}", '{"name": "edit_file", "arguments": {"path": "a.py", "old": "print(\'a\', \'b\')", "new": "x"}}'],
        ids=["single-quoted", "double-quoted"],
    )
    def test_a_call_in_an_array_before_one_cut_off_at_its_brace_runs(self, first):
        """A JSON array of calls cut off right after the next call's opening brace: the whole call before it runs (closed,
        the cut one was an empty object, and the array no calls at all)."""
        assert only(written(f"[{first}, {{")) == ToolCall("edit_file", {"path": "a.py", "old": "print('a', 'b')", "new": "x"}, source="text")

    def test_pretty_printed_single_quoted_calls_one_after_another_are_each_made(self):
        """Two bare single-quoted calls, each pretty-printed, are each made, and the model's words between them are no call."""
        call = "{{\n  'name': 'read_file',\n  'arguments': {{\n    'path': '{}'\n  }}\n}}"
        text = call.format("a.py") + "\nand then\n" + call.format("b.py")
        assert [call.arguments for call in written(text)] == [{"path": "a.py"}, {"path": "b.py"}]

    @pytest.mark.parametrize(
        "members",
        [
            ("'path': 'a.py'", "'content': 'x = 1\\n'"),  # a comma missing between members
            ("'path': 'a.py'", "'content': 'x = {'a': 1}\\n'"),  # a quote before a colon inside a single-quoted string
            ('"path": "a.py"', '"content": "x = 1\\n"'),
            ('"path" "a.py",', '"content": "x = 1\\n"'),  # a colon missing
        ],
        ids=["single-quoted-no-comma", "single-quoted-quote-before-colon", "double-quoted-no-comma", "double-quoted-no-colon"],
    )
    def test_a_pretty_printed_bare_call_that_does_not_read_is_broken(self, members):
        """A bare call pretty-printed over several lines that does not read is a broken call naming its tool, so the model
        is told what to fix: it was dropped without a word, and the model told it had called no tool."""
        quote = members[0][0]
        name, arguments = (f"{quote}{key}{quote}" for key in ("name", "arguments"))
        text = (
            f"I will write it.\n{{\n  {name}: {quote}write_file{quote},\n  {arguments}: {{\n    {members[0]}\n"
            f"    {members[1]}\n  }}\n}}\nThen I run the check."
        )
        call = only(written(text))
        assert isinstance(call, BrokenCall) and (call.name, call.problem) == ("write_file", "unparseable"), call

    @pytest.mark.parametrize("quote", ["'", '"'], ids=["single-quoted", "double-quoted"])
    def test_a_pretty_printed_bare_call_cut_off_is_broken_as_cut_off(self, quote):
        """A bare call pretty-printed over several lines that stops inside a string is broken as cut off, as on one line
        (it was dropped without a word); a call on a later line still runs."""
        q = quote
        text = (
            f"I will write it.\n{{\n  {q}name{q}: {q}write_file{q},\n  {q}arguments{q}: {{\n    {q}path{q}: {q}a.py{q},\n"
            f"    {q}content{q}: {q}x = 1"
        )
        cut = only(written(text))
        assert isinstance(cut, BrokenCall) and (cut.name, cut.problem) == ("write_file", "unparseable"), cut
        assert "end in the middle of a value" in cut.detail, cut
        cut, read = written(text + '\n{"name": "read_file", "arguments": {"path": "a.py"}}')
        assert isinstance(cut, BrokenCall) and cut.name == "write_file", cut
        assert read == ToolCall("read_file", {"path": "a.py"}, source="text"), read

    def test_pretty_printed_json_that_names_no_tool_and_does_not_read_is_no_call(self):
        """Invalid JSON over several lines that names no tool (a package.json shown with a comment) is the model's text,
        not a broken call."""
        text = 'My package.json:\n{\n  "name": "app",\n  // the version\n  "version": "1.0"\n}\nWhat next?'
        assert written(text) == []

    @pytest.mark.parametrize("form", ["bare", "tagged", "fenced"])
    def test_a_whole_call_before_one_that_ends_mid_value_in_a_json_array_still_runs(self, form):
        """Calls written as one JSON array whose last stops where a value was due: the calls before it are whole and
        run (a burst whose last call was cut off), only the last is broken."""
        body = (
            '[{"name": "read_file", "arguments": {"path": "greet.py"}}, '
            '{"name": "edit_file", "arguments": {"path": "greet.py", "old": "helo", "new": '
        )
        text = {"bare": body, "tagged": f"<tool_call>{body}</tool_call>", "fenced": f"```json\n{body}\n```"}[form]
        read, edit = written(text)
        assert read == ToolCall("read_file", {"path": "greet.py"}, source="text"), read
        assert isinstance(edit, BrokenCall) and (edit.name, edit.problem) == ("edit_file", "unparseable"), edit
        assert "end in the middle of a value" in edit.detail

    @pytest.mark.parametrize("layout", ["raw-newlines", "pretty-printed"])
    def test_a_whole_bare_call_over_several_lines_with_a_slip_is_mended_whole(self, layout):
        """A bare JSON call over several lines (its string with raw newlines, or pretty-printed) with a stray
        backslash is the whole call mended, not its first line read as a call cut inside a string."""
        content = "import re\nPAT = re.compile('\\d+')\n"  # `\d` as a model writes it: no JSON escape
        raw_newlines = '{"name": "write_file", "arguments": {"path": "a.py", "content": "' + content + '"}}'
        pretty = '{\n  "name": "write_file",\n  "arguments": {\n    "path": "a.py",\n    "content": "' + content.replace("\n", "\\n") + '"\n  }\n}'
        text = "I will write it.\n" + {"raw-newlines": raw_newlines, "pretty-printed": pretty}[layout] + "\nThen I run the check."
        call = only(written(text))
        assert call == ToolCall("write_file", {"path": "a.py", "content": content}, source="text"), call

    def test_each_of_a_dozen_broken_calls_after_words_is_read_not_only_the_first_eight(self):
        """Twelve calls after words, each with a trailing comma, are each read mended: a count of eight looks for where a
        broken call closes dropped the last four without a word; the looks now share one budget in characters."""
        text = "".join(f'Step {i}: {{"name": "read_file", "arguments": {{"path": "f{i}.py",}}}}\n' for i in range(12))
        calls = written(text)
        assert [call.arguments for call in calls] == [{"path": f"f{i}.py"} for i in range(12)], calls
        assert all(isinstance(call, ToolCall) for call in calls), calls

    def test_many_broken_call_like_lines_are_read_in_linear_time(self):
        """An answer of thousands of call-like lines that do not read stays quick: a call is mended whole from
        only the first few of them (each try reads the rest of the answer)."""
        text = "Here:\n" + '{"name": "x\\d" \n' * 4000
        started = time.perf_counter()
        written(text)
        assert time.perf_counter() - started < 3.0

    def test_bare_call_cut_at_the_length_limit_is_unparseable(self):
        """A bare JSON call cut off at the length limit is reported, not dropped or completed."""
        text = 'I will write it.\n{"name": "write_file", "arguments": {"path": "a.py", "content": "def f('
        call = only(written(text, finish_reason="length"))
        assert isinstance(call, BrokenCall) and call.problem == "unparseable"


    @pytest.mark.parametrize(
        "opening",
        ["[", "[ ", '{"tool_calls": ['],
        ids=["array", "array-spaced", "tool-calls-wrapper"],
    )
    @pytest.mark.parametrize(
        "cut_call",
        ['{"name": "write_file", "arguments": {"path": "b.py", "content": "x = ', "{", '{"na', '{\n  "name'],
        ids=["inside-a-string", "at-its-brace", "before-its-name", "pretty-before-its-name"],
    )
    @pytest.mark.parametrize("before", ["Here they are: ", "", "```json\n"], ids=["after-prose", "bare", "fenced"])
    def test_calls_in_an_array_cut_at_the_length_limit_do_not_run(self, before, opening, cut_call):
        """An array of calls that the length limit cut off yields no call, its whole calls included, after prose as at a
        line's start or in a fence, even when the last was cut before it named its tool: they are cut off, not run
        while the cut one is dropped without a word, nor all dropped and the model told it called no tool."""
        read = '{"name": "read_file", "arguments": {"path": "a.py"}}'
        calls = written(f"{before}{opening}{read}, {cut_call}", finish_reason="length")
        assert calls and all(isinstance(call, BrokenCall) for call in calls), calls
        assert calls[0].name == "read_file" and calls[0].detail == "cut off at the length limit", calls

    def test_a_whole_call_after_prose_runs_and_the_one_cut_at_the_length_limit_is_reported(self):
        """A whole call after prose is a value of its own and runs; the call after it, cut off at the length limit, is
        reported as cut off (it was dropped without a word)."""
        text = 'I read it. {"name": "read_file", "arguments": {"path": "a.py"}} then {"name": "write_file", "arguments": {"path": "b.py", "content": "x = '
        read, write = written(text, finish_reason="length")
        assert read == ToolCall("read_file", {"path": "a.py"}, source="text"), read
        assert isinstance(write, BrokenCall) and (write.name, write.detail) == ("write_file", "cut off at the length limit"), write

    @pytest.mark.parametrize(
        "call",
        [
            '{"name": "write_file", "arguments": {"path": "a.txt", "content": "hel',
            '{"name": "write_file", "arguments": {"path": "a.txt", "content": ',
            '{"name": "write_file", "arguments": {"path": "a.txt",\n  "content": "hel',
            '{"tool": "write_file", "args": {"path": "a.txt", "content": "hel',
        ],
        ids=["inside-a-string", "where-a-value-was-due", "over-lines", "tool-key"],
    )
    def test_a_call_after_prose_cut_off_though_the_answer_stopped_is_reported_as_cut_off(self, call):
        """A call after prose on its line that stops mid-value in an answer that ended as usual (not at the length limit)
        is a broken call saying it was cut off, naming its tool, never run (it was dropped: the model was told it had
        called no tool)."""
        assert_cut_off(only(written(f"I will write it now. {call}")), "write_file")

    def test_a_call_after_prose_that_never_closes_and_does_not_read_is_reported_as_unreadable(self):
        """A call after prose that never closes, lacking only its closing brace, is a broken call the model is told
        to write again as valid JSON: after prose only whole JSON runs (it was dropped without a word)."""
        broken = only(written('I will write it now. {"name": "write_file", "arguments": {"path": "a.txt", "content": "x"}'))
        assert isinstance(broken, BrokenCall) and (broken.name, broken.problem) == ("write_file", "unparseable"), broken
        assert broken.detail.startswith("the call is not valid JSON ("), broken

    @pytest.mark.parametrize(
        "text",
        [
            'The config is {"name": "app", "version": "1.',
            'It would be {"name": "run_command", "arguments": {"command": "ls',
            'The call form is {"name": name_var, "arguments": {"path": "a',
            'I read {"name": "read_file", "arguments": {"path": "a.py"}} and the data {"name": "app", "v": "1',
        ],
        ids=["other-json", "unknown-tool", "name-not-a-string", "after-a-whole-call"],
    )
    def test_json_after_prose_cut_off_that_names_no_tool_is_no_broken_call(self, text):
        """JSON after prose that never closes but names no tool (a config shown, an unknown tool, a name that is no
        string) is the model's text: no broken call is made of it."""
        assert all(isinstance(call, ToolCall) for call in written(text)), written(text)

    def test_a_flood_of_unclosed_call_starts_after_prose_is_read_quickly(self):
        """Thousands of nested call-like starts after prose that never read stay quick: a call's end is looked for
        from only the first few of them."""
        text = "Here: " + '{"name": "read_file", "arguments": ' * 1000 + "}" * 1000
        started = time.perf_counter()
        written(text)
        assert time.perf_counter() - started < 3.0

    def test_a_whole_call_after_one_cut_off_after_prose_still_runs(self):
        """A call after prose that never closes is broken as cut off, and a whole call written after its start still
        runs, as it did."""
        text = 'I will write it. {"name": "write_file", "arguments": {"path": "a.txt", "content": "x\n; {"name": "read_file", "arguments": {"path": "a.py"}}'
        cut, read = written(text)
        assert isinstance(cut, BrokenCall) and cut.name == "write_file", cut
        assert read == ToolCall("read_file", {"path": "a.py"}, source="text"), read

    def test_a_pretty_printed_call_cut_off_whose_first_line_reads_as_a_call_does_not_run(self):
        """A bare call pretty-printed from its arguments' brace on, cut inside a string, is cut off and never run (its
        first line alone, `{"name": "run_check", "arguments": {`, ran as a call without arguments)."""
        assert_cut_off(only(written('{"name": "run_check", "arguments": {\n    "pat')), "run_check")

    @pytest.mark.parametrize(
        ("quote", "layout"),
        [("'", "one-line"), ('"', "one-line"), ('"', "pretty-printed"), ('"', "brace-alone")],
        ids=["single-quoted-one-line", "double-quoted-one-line", "double-quoted-pretty-printed", "double-quoted-brace-alone"],
    )
    def test_a_bare_call_lacking_only_its_closing_brackets_runs_in_each_layout(self, quote, layout):
        """A bare call that lacks only its closing brackets, every value whole, runs with them closed, pretty-printed as
        on one line (pretty-printed, its first line was read alone as a call without arguments, or it was unreadable)."""
        q = quote
        first, joint = {"one-line": ("{", " "), "pretty-printed": ("{", "\n "), "brace-alone": ("{\n ", "\n ")}[layout]
        text = f"{first}{q}name{q}: {q}write_file{q},{joint}{q}arguments{q}: {{{q}content{q}: {q}x{q}, {q}path{q}: {q}a.txt{q}"
        assert only(written(text)) == ToolCall("write_file", {"path": "a.txt", "content": "x"}, source="text")

    @pytest.mark.parametrize("quote", ["'", '"'], ids=["single-quoted", "double-quoted"])
    @pytest.mark.parametrize("layout", ["one-line", "pretty-printed", "brace-alone"])
    def test_a_bare_call_cut_inside_a_string_is_cut_off_in_each_layout(self, quote, layout):
        """A bare call that stops inside a string is a broken call saying it was cut off, never run, pretty-printed as on
        one line (pretty-printed, it was told it lacked the parameter 'path' it had written)."""
        q = quote
        first, joint = {"one-line": ("{", " "), "pretty-printed": ("{", "\n "), "brace-alone": ("{\n ", "\n ")}[layout]
        text = f"{first}{q}name{q}: {q}write_file{q},{joint}{q}arguments{q}: {{{q}path{q}: {q}a.txt{q}, {q}content{q}: {q}x = 1"
        assert_cut_off(only(written(text)), "write_file")


    @pytest.mark.parametrize(
        "call",
        [
            "{'name': 'write_file', 'arguments': {'path': 'a.py', 'content': 'return {'",
            "{'name': 'write_file', 'arguments': {'path': 'a.js', 'content': 'const o = {a: 'x'}",
            '{"name": "write_file", "arguments": {"path": "a.py", "content": \'x = {\'a\': \'b\'}',
            "{'name': 'write_file', 'arguments': {'path': 'a.py', 'content': 's = 'x'",
            "{'name': 'write_file', 'arguments': {'path': 'a.py', 'content': 'print('",
            "{'name': 'write_file', 'arguments': {'path': 'a.txt', 'content': 'He said '",
            "{'name': 'write_file', 'arguments': {'path': 'b.js', 'content': 'const o = {a: 'x', 'path': 'a.py'}",
            "{'name': 'write_file', 'arguments': {'path': 'a.txt', 'content': 'it's done'}",
            "{'name': 'write_file', 'arguments': {'path': 'a.txt', 'content': 'don'",
        ],
        ids=[
            "after-a-brace", "quote-then-brace", "double-quoted-keys", "after-an-assignment", "after-a-paren", "after-a-space",
            "a-key-in-the-content", "whole-or-cut-after-an-apostrophe", "whole-or-cut-a-word",
        ],
    )
    @pytest.mark.parametrize("form", ["bare", "after-prose", "fenced", "tagged"])
    def test_a_one_line_single_quoted_call_that_ends_on_a_quote_inside_its_content_does_not_run(self, call, form):
        """A one-line call that never closes and ends on a single quote (then only closing brackets) that may be one
        inside its content, the answer stopped after it, is a broken call saying it was cut off, never run: a write ran
        with its content cut (`'return {'` of `'return {'a': 1}'`), or, the content holding `'path': 'a.py'`, to another file;
        a whole call of that shape (`'it's done'}`, its outer brace missing; `'don'`, which may be `'don't'` cut) cannot be
        told from a cut one, and is lost."""
        text = as_answer(call, form)
        assert_cut_off(only(written(text)), "write_file")

    @pytest.mark.parametrize(
        "call",
        [
            "{'name': 'write_file', 'arguments': {'path': 'a.py', 'content': 't = {'a': 'b'}}",
            '{"name": "write_file", "arguments": {"path": "a.py", "content": "d = {"k": 1}}',
            '{"name": "write_file", "arguments": {"path": "a.py", "content": "print("hi")',
            '{"name": "write_file", "arguments": {"path": "a.js", "content": "const s = "}"; f(s);"}}',
            '{"name": "write_file", "arguments": {"path": "a.py", "content": "d = {"k": 1}\\nx = 2}',
        ],
        ids=[
            "single-quoted-cut-after-a-brace", "double-quoted-cut-after-a-brace", "double-quoted-never-closed", "closed-early",
            "double-quoted-cut-a-line-after-a-brace",
        ],
    )
    @pytest.mark.parametrize("form", ["bare", "after-prose", "tagged"])
    def test_a_call_closed_by_a_bracket_of_its_content_does_not_run(self, call, form):
        """A call whose content holds a quote taken for a string's end, then a `}` of the content taken for the arguments'
        (cut right after it, or followed by the rest of the content), is a broken call, never run with its content cut."""
        call = only(written(as_answer(call, form)))
        assert isinstance(call, BrokenCall) and (call.name, call.problem) == ("write_file", "unparseable"), call

    @pytest.mark.parametrize(
        "call",
        [
            "{'name': 'write_file', 'arguments': {'path': 'a.py', 'content': 't = {'a': 'b'}}",
            '{"name": "write_file", "arguments": {"path": "a.js", "content": "const s = "}"; f(s);"}}',
        ],
        ids=["single-quoted-cut-after-a-brace", "closed-early"],
    )
    def test_a_fenced_call_closed_by_a_bracket_of_its_content_does_not_run(self, call):
        """In a ```json fence too, a call whose `}` of the content was taken for the arguments' is broken, never run cut."""
        call = only(written(as_answer(call, "fenced")))
        assert isinstance(call, BrokenCall) and (call.name, call.problem) == ("write_file", "unparseable"), call

    @pytest.mark.parametrize("form", ["bare", "after-prose", "fenced", "tagged"])
    def test_a_single_quoted_call_whose_content_holds_a_double_quoted_string_before_a_bracket_runs(self, form):
        """A whole single-quoted call whose content holds a quote of its own, then a double-quoted string, a `}` and more
        code (`'o = {a: 'x', b: "y"};\\nexport'`) runs with exactly that content: that `}` was read as one a quote of the
        content let close the call, and the call was refused as cut off."""
        content = "'const o = {a: 'x', b: \"y\"};\\nexport default o;\\n'"
        call = "{'name': 'write_file', 'arguments': {'path': 'o.js', 'content': " + content + "}}"
        expected = {"path": "o.js", "content": "const o = {a: 'x', b: \"y\"};\nexport default o;\n"}
        assert only(written(as_answer(call, form))) == ToolCall("write_file", expected, source="text")

    def test_a_mixed_quoted_call_closed_early_by_a_bracket_of_its_content_does_not_run(self):
        """Single-quoted keys, a double-quoted content whose quote not escaped let its `}` close it (`"s = "}"; f(s);"`):
        a broken call, never run with `const s = ` alone."""
        call = "{'name': 'write_file', 'arguments': {'path': 'a.js', 'content': \"const s = \"}\"; f(s);\"}}"
        call = only(written(call))
        assert isinstance(call, BrokenCall) and (call.name, call.problem) == ("write_file", "unparseable"), call

    def test_a_whole_call_after_a_sentence_whose_content_holds_quotes_not_escaped_runs(self):
        """A call after a sentence on its line, its content holding double quotes not escaped (`"print("hi")"`), runs
        with exactly that content, as on a line of its own: it was dropped, the model told it had called no tool."""
        text = 'I will write it. {"name": "write_file", "arguments": {"path": "a.py", "content": "print("hi")"}}'
        assert only(written(text)) == ToolCall("write_file", {"path": "a.py", "content": 'print("hi")'}, source="text")

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            (
                "I will write it now: {'name': 'write_file', 'arguments': {'path': 'a.py', 'content': 'x = 1\\n'}}",
                [("write_file", {"path": "a.py", "content": "x = 1\n"})],
            ),
            ("Reading it: {'name': 'read_file', 'arguments': {'path': 'a.py'}} and then done.", [("read_file", {"path": "a.py"})]),
            (
                "I will: {'name': 'write_file', 'arguments': {'path': 'i.py', 'content': 'ITEMS = [{'id': 1}]\\n'}}",
                [("write_file", {"path": "i.py", "content": "ITEMS = [{'id': 1}]\n"})],
            ),
            (
                "Now {'name': 'read_file', 'arguments': {'path': 'a.py'}} then {'name': 'read_file', 'arguments': {'path': 'b.py'}}",
                [("read_file", {"path": "a.py"}), ("read_file", {"path": "b.py"})],
            ),
        ],
        ids=["write", "words-after", "quotes-in-its-content", "two-on-a-line"],
    )
    def test_a_single_quoted_call_after_a_sentence_runs(self, text, expected):
        """A single-quoted call after a sentence on its line runs as a double-quoted one does, each of several on the line
        too: it was never read, the model told it had called no tool."""
        assert written(text) == [ToolCall(name, arguments, source="text") for name, arguments in expected]

    @pytest.mark.parametrize(
        "call",
        [
            "{'name': 'write_file', 'arguments': {'path': 'a.py', 'content': 'x = ",
            "{'name': 'write_file', 'arguments': {'path': 'a.py', 'content': 't = {'a': 'b'}",
        ],
        ids=["inside-a-string", "after-a-bracket-of-its-content"],
    )
    def test_a_single_quoted_call_after_a_sentence_cut_off_does_not_run(self, call):
        """A single-quoted call after a sentence on its line that stops mid-value is cut off, never run nor dropped, as a
        double-quoted one is; at the length limit too."""
        assert_cut_off(only(written(f"I will write it now: {call}")), "write_file")
        at_the_limit = only(written(f"I will write it now: {call}", finish_reason="length"))
        assert isinstance(at_the_limit, BrokenCall) and at_the_limit.detail == "cut off at the length limit", at_the_limit

    def test_a_flood_of_single_quoted_call_starts_after_prose_is_read_quickly(self):
        """Thousands of single-quoted call starts after prose that never close stay quick (each look for a call's end may
        read to the answer's end: they read at most a few times its length in all) and give one broken call."""
        text = "Here: " + "{'name': 'write_file', 'arguments': {'path': 'a.py', 'content': '" * 3000
        started = time.perf_counter()
        calls = written(text)
        assert time.perf_counter() - started < 5.0
        assert_cut_off(only(calls), "write_file")

    def test_a_call_after_a_sentence_cut_after_a_bracket_of_its_content_does_not_run(self):
        """A call after a sentence on its line, cut right after a `}` of its content, is cut off, never run nor dropped."""
        text = 'I will write it. {"name": "write_file", "arguments": {"path": "a.py", "content": "d = {"k": 1}}'
        assert_cut_off(only(written(text)), "write_file")

    @pytest.mark.parametrize(
        "arguments",
        [
            "{'path': 'a.py', 'content': 't = {'a': 'b'}",
            '{"path": "a.py", "content": "d = {"k": 1}',
            '{"path": "a.py", "content": "print("hi")',
        ],
        ids=["single-quoted", "double-quoted", "never-closed"],
    )
    def test_a_function_tag_call_cut_after_a_bracket_of_its_content_does_not_run(self, arguments):
        """`<function=write_file>` arguments cut right after a `}` of their content are cut off, never run."""
        assert_cut_off(only(written("<function=write_file>" + arguments)), "write_file")

    @pytest.mark.parametrize(
        "content",
        ["'if x == 'y':\\n", "'x = {'a': 'b'}\\ny =", "'CONFIG = {\\n    'debug': False,", "'const o = {a: 'x', b: \"y\"};\\nexport"],
        ids=["after-a-colon", "after-a-quoted-key", "after-a-comma", "after-a-word"],
    )
    @pytest.mark.parametrize("form", ["bare", "after-prose", "fenced", "tagged"])
    def test_a_one_line_single_quoted_call_that_never_closes_after_a_quote_inside_its_content_does_not_run(self, content, form):
        """A one-line single-quoted call that never closes, read with a quote inside its content taken for a string's end (a
        quote before a colon, `'if x == 'y':`, or one holding a quote, `'const o = {a: 'x'`), is a broken call saying it was
        cut off, never run, wherever the text stops: read on, a write ran with its content cut (`x = {'a': 'b'}\\ny =`)."""
        call = "{'name': 'write_file', 'arguments': {'path': 'f.py', 'content': " + content
        text = as_answer(call, form)
        assert_cut_off(only(written(text)), "write_file")

    @pytest.mark.parametrize(
        "arguments",
        [
            "{'path': 'b.py', 'content': 'd = {'name': 'x', 'path': 'a.py'}\\n'}",
            "{'path': 'b.js', 'content': 'x', 'path': 'a.py'}",
            "{path: 'b.js', content: 'x', path: 'a.py'}",
        ],
        ids=["the-contents-own-keys", "a-key-after-the-content", "bare-keys"],
    )
    @pytest.mark.parametrize("form", ["bare", "after-prose", "fenced", "tagged"])
    def test_a_single_quoted_call_whose_arguments_name_a_key_twice_does_not_run(self, arguments, form):
        """A single-quoted call whose arguments, read loosely or repaired, name a key twice is a broken call naming its tool,
        never run: the content's own `'path': 'a.py'` was read as a key, the last one won, and a write went to another file."""
        call = "{'name': 'write_file', 'arguments': " + arguments + "}"
        text = as_answer(call, form)
        broken = only(written(text))
        assert isinstance(broken, BrokenCall) and (broken.name, broken.problem) == ("write_file", "unparseable"), broken
        assert "names the key 'path' twice" in broken.detail, broken

    @pytest.mark.parametrize(
        "arguments",
        ["{'path': 'b.js', 'content': 'x', 'path': 'a.py'}", "{path: 'b.js', content: 'x', path: 'a.py'}"],
        ids=["a-key-after-the-content", "bare-keys"],
    )
    def test_a_pretty_printed_single_quoted_call_whose_arguments_name_a_key_twice_does_not_run(self, arguments):
        """A pretty-printed single-quoted call whose arguments, read loosely, name a key twice is a broken call naming its
        tool, never run, as its one-line twin is."""
        broken = only(written("{\n  'name': 'write_file',\n  'arguments': " + arguments + "\n}"))
        assert isinstance(broken, BrokenCall) and (broken.name, broken.problem) == ("write_file", "unparseable"), broken
        assert "names the key 'path' twice" in broken.detail, broken

    @pytest.mark.parametrize("form", ["bare", "fenced", "tagged"])
    def test_a_single_quoted_call_that_names_its_tool_twice_does_not_run(self, form):
        """A single-quoted call object that names a key twice (`'name'`) is a broken call, never run: which one the model
        meant cannot be told."""
        call = "{'name': 'read_file', 'arguments': {'path': 'a.py'}, 'name': 'write_file'}"
        text = as_answer(call, form)
        broken = only(written(text))
        assert isinstance(broken, BrokenCall) and broken.problem == "unparseable", broken
        assert "names the key 'name' twice" in broken.detail, broken

    @pytest.mark.parametrize("form", ["bare", "fenced", "tagged"])
    def test_a_double_quoted_call_whose_content_quotes_a_key_name_unescaped_still_runs(self, form):
        """A double-quoted call whose content holds a key's name in unescaped double quotes, not followed by a colon
        (`f("old", "new")`), still runs as repaired: the name is the content's word, no key named twice."""
        call = '{"name": "edit_file", "arguments": {"path": "a.py", "old": "x", "new": "f("old", "new")"}}'
        text = as_answer(call, form)
        ran = only(written(text))
        assert ran == ToolCall("edit_file", {"path": "a.py", "old": "x", "new": 'f("old", "new")'}, source="text"), ran

    def test_a_json_call_whose_arguments_name_a_key_twice_still_runs_with_the_last(self):
        """A strict JSON call whose arguments name a key twice runs as JSON reads it, with the last one, as before."""
        call = only(written('{"name": "write_file", "arguments": {"path": "b.js", "content": "x", "path": "a.py"}}'))
        assert call == ToolCall("write_file", {"path": "a.py", "content": "x"}, source="text")

    @pytest.mark.parametrize(
        "content",
        ["'function f() {\n  return 'x'\n}", "'const o = {a: 'x',}", "'s = 'x'\n  }", "'return {'", "'x'}"],
        ids=["cut-after-a-functions-brace", "cut-after-a-trailing-comma-and-brace", "cut-after-a-brace-line", "cut-after-a-brace", "whole-or-cut"],
    )
    @pytest.mark.parametrize("form", ["fenced", "tagged"])
    def test_a_pretty_printed_single_quoted_call_in_a_fence_or_tag_that_ends_on_a_quote_inside_its_content_does_not_run(self, content, form):
        """A pretty-printed single-quoted call in a fence or a tag that never closes and ends on a quote (then only closing
        brackets) that may be one inside its content is a broken call saying it was cut off, never run, as a bare one is
        never run: read there as a block, a write ran with its content cut (`'const o = {a: 'x'}` as `const o = {a: 'x`)."""
        body = "{\n  'name': 'write_file',\n  'arguments': {\n    'path': 'a.js',\n    'content': " + content
        text = as_answer(body, form)
        assert_cut_off(only(written(text)), "write_file")

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("{'name': 'read_file', 'arguments': {'path': 'a.py'}", ToolCall("read_file", {"path": "a.py"}, source="text")),
            ("{'name': 'read_file', 'arguments': {'path': 'src/a.py'", ToolCall("read_file", {"path": "src/a.py"}, source="text")),
            ("{'name': 'list_dir'", ToolCall("list_dir", {}, source="text")),
            ("{'name': 'search', 'arguments': {'pattern': 'def main', 'path': '.'", ToolCall("search", {"pattern": "def main", "path": "."}, source="text")),
        ],
        ids=["a-path-then-a-brace", "a-path", "a-name", "a-dot"],
    )
    def test_a_one_line_single_quoted_call_lacking_only_its_brackets_whose_last_string_is_a_path_or_name_runs(self, text, expected):
        """A one-line single-quoted call lacking only its closing brackets whose last string is a path or a name (one word
        holding a digit, `_`, `.`, `/` or `-`), after no single-quoted string holding a quote, still runs with its brackets
        closed: no quote goes on after such a word."""
        assert only(written(text)) == expected

    @pytest.mark.parametrize(
        "content",
        ["'x'", "'def f(x):\\n    return {'", "'x = {'k'", "'it'"],
        ids=["whole-or-cut", "cut-after-a-quote-opening-a-string", "cut-after-a-quoted-key", "cut-after-an-apostrophe"],
    )
    @pytest.mark.parametrize("layout", ["pretty-printed", "brace-alone"])
    def test_a_pretty_printed_single_quoted_call_that_never_closes_and_ends_on_a_quote_does_not_run(self, content, layout):
        """A pretty-printed single-quoted call that never closes and ends on a quote is a broken call naming its tool,
        never run with its brackets closed: that quote may be one inside the content after which the answer stopped
        (`'return {'` of `'return {'a': 1}'`), and a write with the rest cut off would be made."""
        first = {"pretty-printed": "{", "brace-alone": "{\n "}[layout]
        text = f"{first}'name': 'write_file',\n 'arguments': {{'path': 'a.py', 'content': {content}"
        broken = only(written(text))
        assert isinstance(broken, BrokenCall) and (broken.name, broken.problem) == ("write_file", "unparseable"), broken

    @pytest.mark.parametrize(
        "content",
        ["'function f() {\n  return 'x'\n}", "'const o = {a: 'x'}", "'const o = {a: 'x',}", "'names = {'x'}", "'s = 'x'\n  }", "'x'}"],
        ids=[
            "cut-after-a-functions-brace", "cut-after-an-objects-brace", "cut-after-a-trailing-comma-and-brace", "cut-after-a-sets-brace",
            "cut-after-a-brace-line", "whole-or-cut",
        ],
    )
    def test_a_pretty_printed_single_quoted_call_that_ends_on_a_quote_then_closing_brackets_does_not_run(self, content):
        """A pretty-printed single-quoted call that never closes and ends on a quote then only closing brackets (and
        commas) is a broken call, never run: the quote and the brace may be the content's own (a function's `}` line
        after `return 'x'`) after which the answer stopped, and, taken for the arguments' brace, a write with its rest
        cut off would be made."""
        text = "{\n  'name': 'write_file',\n  'arguments': {\n    'path': 'a.js',\n    'content': " + content
        broken = only(written(text))
        assert isinstance(broken, BrokenCall) and (broken.name, broken.problem) == ("write_file", "unparseable"), broken

    @pytest.mark.parametrize(
        "rest",
        ['"def f(x):\n    return 1\n{"', '"x = 1\ny = 2"'],
        ids=["run-into-the-next-calls-start", "whole-or-cut-after-a-line-break"],
    )
    def test_a_pretty_printed_call_ending_on_a_quote_that_closes_a_string_begun_on_an_earlier_line_does_not_run(self, rest):
        """A pretty-printed call that never closes, whose text ends on a double quote closing a string that holds a raw
        line break, is a broken call, never run: cut inside that string, it ran into the next call's `{"` (as on one
        line, where it is cut off)."""
        text = '{\n  "name": "write_file",\n  "arguments": {\n    "path": "a.py",\n    "content": ' + rest
        broken = only(written(text))
        assert isinstance(broken, BrokenCall) and (broken.name, broken.problem) == ("write_file", "unparseable"), broken

    @pytest.mark.parametrize(
        ("text", "tool"),
        [
            ('{\n  "name": "list_dir",', "list_dir"),
            ("{\n  'name': 'list_dir',", "list_dir"),
            ('{\n  "name": "read_file",\n  "arguments": {\n    "path": "a.py",', "read_file"),
        ],
        ids=["after-its-name", "single-quoted", "after-an-argument"],
    )
    def test_a_pretty_printed_call_that_ends_after_a_comma_does_not_run(self, text, tool):
        """A pretty-printed call whose text ends right after a comma, where more was to come, is a broken call naming
        its tool, never run with its brackets closed (`list_dir` without the path it was about to be given)."""
        broken = only(written(text))
        assert isinstance(broken, BrokenCall) and (broken.name, broken.problem) == (tool, "unparseable"), broken

    def test_a_pretty_printed_call_cut_where_a_value_was_due_leaves_the_whole_call_after_it_to_run(self):
        """A pretty-printed call cut where a value was due, then a whole call on a later line: the whole call runs and
        the cut one is a broken call (read to the answer's end, the next call was taken for its missing value, the model
        told it lacked 'content', and the whole call lost)."""
        text = '{\n  "name": "write_file",\n  "arguments": {\n    "path": \n\n{"name": "read_file", "arguments": {"path": "a.py"}}'
        broken, read = written(text)
        assert isinstance(broken, BrokenCall) and (broken.name, broken.problem) == ("write_file", "unparseable"), broken
        assert read == ToolCall("read_file", {"path": "a.py"}, source="text"), read

    @pytest.mark.parametrize(
        "later",
        ['[{"name": "read_file", "arguments": {"path": "a.py"}}]', '{"tool_calls": [{"name": "read_file", "arguments": {"path": "a.py"}}]}'],
        ids=["in-an-array", "in-a-tool-calls-object"],
    )
    def test_a_pretty_printed_call_cut_where_a_value_was_due_leaves_the_whole_call_in_an_array_after_it_to_run(self, later):
        """A pretty-printed call cut where a value was due, then a whole call in an array on a later line: the whole call
        runs (read to the answer's end, the array was taken for the missing value, and its call lost)."""
        text = '{\n  "name": "write_file",\n  "arguments": {\n    "path": "a.py",\n    "content": \n' + later
        calls = written(text)
        assert ToolCall("read_file", {"path": "a.py"}, source="text") in calls, calls
        assert not any(isinstance(call, ToolCall) and call.name == "write_file" for call in calls), calls

    @pytest.mark.parametrize(
        "prose",
        [
            'The form is {"name": "read_file", "arguments": {"path": "<path>"}.',
            'Format: {"name": "read_file", "arguments": {...}',
            'Use {\n  "name": "write_file"',
        ],
        ids=["a-brace-missing", "an-ellipsis", "a-call-begun"],
    )
    def test_a_call_written_as_python_runs_though_prose_before_it_shows_a_call_that_never_closes(self, prose):
        """A call written as Python on its own line runs though the prose before it shows a call's JSON naming a tool
        that never closes: that JSON is no call the answer made, and the Python one was run before."""
        assert only(written(f'{prose}\n[read_file(path="a.py")]')) == ToolCall("read_file", {"path": "a.py"}, source="text")


class TestHostileInput:
    """Whatever a model writes, parsing answers with calls or broken calls, quickly, and never raises."""

    @pytest.mark.parametrize(
        "response",
        [
            ModelResponse(text="", tool_calls=(RawToolCall(name="write_file", arguments="[" * 5000, id="c0"),), finish_reason="tool_calls"),
            ModelResponse(text="<tool_call>" + "[" * 5000, finish_reason="stop"),
            ModelResponse(text="```json\n" + "[" * 5000, finish_reason="stop"),
            ModelResponse(text='{"name": "write_file", "arguments": ' + "[" * 3000 + "]" * 3000 + "}", finish_reason="stop"),
            ModelResponse(text="[" * 5000, finish_reason="length"),
        ],
        ids=["native", "tag", "fence", "bare-json", "cut"],
    )
    def test_json_nested_too_deeply_is_not_a_crash(self, response):
        """JSON deeper than Python's recursion limit was a RecursionError, which ended the iteration as iteration_error."""
        calls = parse_calls(response, SCHEMAS)
        assert all(isinstance(call, BrokenCall) for call in calls)

    def test_arguments_nested_past_the_limit_are_refused_with_the_reason(self):
        """Valid JSON nested more than MAX_JSON_DEPTH levels is refused, and the note says why."""
        deep = '{"path": "a.py", "content": ' + "[" * (MAX_JSON_DEPTH + 5) + "]" * (MAX_JSON_DEPTH + 5) + "}"
        call = only(native(("write_file", deep)))
        assert isinstance(call, BrokenCall) and f"nested more than {MAX_JSON_DEPTH} levels deep" in call.detail
        shallow = '{"path": "a.py", "content": ' + "[" * 10 + "]" * 10 + "}"
        call = only(native(("write_file", shallow)))
        assert isinstance(call, BrokenCall) and "must be a string, got array" in call.detail

    def test_a_fence_line_without_its_line_break_is_linear(self):
        """A long reply that opens a fence and never breaks the line parses at once (it was quadratic: seconds at 64k chars)."""
        started = time.perf_counter()
        assert written("```" + "a" * 64000) == []
        assert time.perf_counter() - started < 1

    def test_arguments_lacking_their_brace_with_a_long_run_of_spaces_in_a_string_parse_at_once(self):
        """Arguments lacking their closing brace whose content holds 100k spaces in a row parse at once, whole: the look for
        an array's item just begun tried each space of the run to its end (quadratic: 14 s at 100 kB, 250 s at 400 kB)."""
        started = time.perf_counter()
        call = only(native(("write_file", '{"path": "a.py", "content": "(' + " " * 100_000 + 'x"'), finish_reason="stop"))
        assert time.perf_counter() - started < 2.0
        assert call == ToolCall("write_file", {"path": "a.py", "content": "(" + " " * 100_000 + "x"}, id="call_0")

    @pytest.mark.parametrize("unit", ["{'", '{"'])
    def test_native_arguments_cut_off_in_a_flood_of_brackets_and_quotes_are_refused_quickly(self, unit):
        """16 kB of `{'` as native arguments (an answer that ended normally) is refused as cut off at once: the
        repair library, which took about 10 s for it (quadratic), is not asked to mend what will not run."""
        started = time.perf_counter()
        call = only(native(("write_file", unit * 8000)))
        assert isinstance(call, BrokenCall) and "end in the middle of a value" in call.detail
        assert time.perf_counter() - started < 2.0

    def test_a_flood_of_call_openings_after_words_is_read_in_linear_time(self):
        """400 kB of `{"name": ` after a sentence, each a place a call may start, is read at once, and a whole call after it
        still runs: the decoder read each start's value to the interpreter's recursion limit before refusing it as nested
        too deeply (4 s at 400 kB on Python 3.11; quadratic on 3.13, whose limit is ten times deeper: 82 s)."""
        text = "I will now call it: " + '{"name": ' * 44_000 + '\nNow the real one: {"name": "list_dir", "arguments": {"path": "."}}'
        started = time.process_time()
        calls = written(text)
        assert time.process_time() - started < 2.0
        assert calls == [ToolCall("list_dir", {"path": "."}, source="text")], calls

    def test_a_flood_of_call_starts_that_fail_at_once_is_read_in_linear_time(self):
        """400 kB of `{"name":} ` after a sentence is read at once: json's error for each start, failing at once, counted the
        line breaks from the answer's start to its place (quadratic: 3.7 s at 400 kB)."""
        started = time.process_time()
        assert written("I will now call it: " + '{"name":} ' * 40_000) == []
        assert time.process_time() - started < 1.5

    def test_a_flood_of_single_quoted_calls_that_never_close_is_read_quickly(self):
        """400 kB of `{'name': 'read_file', 'arguments': {` after a sentence is one broken call, and a whole call after it
        runs, at once: each start inside the first one's text was also reported as broken, at three readings of the rest
        of the answer each, then dropped (5 to 9 s at 400 kB)."""
        text = "I will now call it: " + "{'name': 'read_file', 'arguments': {" * 11_000
        started = time.process_time()
        calls = written(text + '\nNow: {"name": "list_dir", "arguments": {"path": "."}}')
        assert time.process_time() - started < 3.0
        assert [(type(call), call.name) for call in calls] == [(BrokenCall, "read_file"), (ToolCall, "list_dir")], calls

    def test_a_long_call_with_a_bare_word_before_deep_brackets_is_told_its_json_error_not_that_it_nests_too_deeply(self):
        """A call over 2 kB whose arguments hold `[x, [x, ...` 66 levels deep is told json's own error, at the first `x`:
        the look that refuses a value opening too deep at once took any word for a scalar and named the nesting instead."""
        text = 'Calling it: {"name": "read_file", "arguments": {"path": "a.py", "x": ' + "[x, " * 66 + " " * 2048 + "}}"
        call = only(written(text))
        assert isinstance(call, BrokenCall) and "(Expecting value at char 58)" in call.detail, call

    def test_a_long_call_whose_json_fails_before_deep_brackets_is_told_that_error_not_that_it_nests_too_deeply(self):
        """A call whose arguments fail at `1 [` past 2,000 spaces, then open 66 brackets, is told json's error there: the
        count of the brackets to refuse a value nested too deeply went on past the place json's reading stops."""
        text = 'Calling it: {"name": "read_file", "arguments": {"path": "a.py", "x": [' + " " * 2000 + "1 " + "[" * 66 + "}}"
        call = only(written(text))
        assert isinstance(call, BrokenCall) and "(Expecting ',' delimiter at char 2060)" in call.detail, call


class TestArgumentsProblem:
    def test_fitting_arguments_have_no_problem(self):
        """Arguments that fit give an empty string."""
        parameters = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        assert arguments_problem(parameters, {"n": 3}) == ""

    def test_boolean_is_not_an_integer(self):
        """true is not accepted where an integer is declared."""
        parameters = {"type": "object", "properties": {"n": {"type": "integer"}}}
        assert arguments_problem(parameters, {"n": True}) == "parameter 'n' must be an integer, got boolean"


class TestDescribeCall:
    def test_call_reads_like_a_function_call(self):
        """A ToolCall is shown as name(key="value", ...)."""
        assert describe_call(ToolCall("read_file", {"path": "a.py"})) == 'read_file(path="a.py")'

    def test_long_call_is_truncated(self):
        """A call with a long argument stays within the limit on one line."""
        text = describe_call(ToolCall("write_file", {"path": "a.py", "content": "x\n" * 500}))
        assert len(text) <= 120 and "\n" not in text and text.startswith('write_file(path="a.py", content="x\\n')

    def test_broken_call_shows_its_raw_arguments(self):
        """A BrokenCall shows its raw arguments on one line, and '?' for a missing name."""
        call = BrokenCall(name="", raw_arguments='{"a":\n 1}', problem="empty_tool_name", detail="")
        assert describe_call(call) == '?({"a": 1})'


class TestSmallModelsOwnForms:
    """Forms real small models write, from an outside review: each was misread before."""

    def test_a_call_considered_while_thinking_is_not_made(self):
        """Qwen3 and R1 distills served without a reasoning parser leave `<think>` in the text: the submit
        the model only considered ran, and the read it made was dropped."""
        text = (
            '<think>\nOnce the check passes I would call <tool_call>{"name": "submit", "arguments": {"summary": "done"}}'
            "</tool_call> but first I need to look at the file.\n</think>\n"
            '<tool_call>\n{"name": "read_file", "arguments": {"path": "app.py"}}\n</tool_call>'
        )
        assert only(written(text)) == ToolCall("read_file", {"path": "app.py"}, source="text")
        rejected = '<think>\nI could empty it with {"name": "write_file", "arguments": {"path": "app.py", "content": ""}} but no.\n</think>\nLet me read it first.'
        assert written(rejected) == []
        # The template opened the tag in the prompt: only its end is in the answer.
        opened = 'thinking about {"name": "submit", "arguments": {"summary": "x"}}\n</think>\n{"name": "list_dir", "arguments": {"path": "."}}'
        assert only(written(opened)).name == "list_dir"

    def test_thinking_in_the_text_is_the_responses_reasoning(self):
        """An answer of only thinking, cut off at the length limit, is judged as reasoning cut off (not
        "do not describe what you would do")."""
        from orchestrator.scripted import Reply, ScriptedModel

        model = ScriptedModel([Reply(text="<think>\nLet me plan: first read app.py, then", finish_reason="length")])
        response = model.complete([{"role": "user", "content": "p"}], SCHEMAS)
        assert response.text == "" and response.reasoning.startswith("<think>") is False and "first read" in response.reasoning

    def test_several_calls_in_one_tag_or_fence_are_each_made(self):
        """json_repair merged two objects with the same keys into the last: the first edit silently never ran."""
        first = '{"name": "edit_file", "arguments": {"path": "app.py", "old": "return 41", "new": "return 42"}}'
        second = '{"name": "edit_file", "arguments": {"path": "app.py", "old": "return \'bob\'", "new": "return \'alice\'"}}'
        for text in (f"<tool_call>\n{first}\n{second}\n</tool_call>", f"```json\n{first}\n{second}\n```"):
            calls = written(text)
            assert [c.arguments["new"] for c in calls] == ["return 42", "return 'alice'"], calls

    def test_several_calls_in_one_tag_each_made_when_one_needs_mending(self):
        """A regex's `\\d` or a trailing comma in one of them sent the whole block through the repair
        library, which kept only the last call: the first search or read silently never ran."""
        backslashes = '<tool_call>{"name": "search", "arguments": {"pattern": "def \\w+"}}\n{"name": "search", "arguments": {"pattern": "\\d+ items"}}</tool_call>'
        assert [c.arguments["pattern"] for c in written(backslashes)] == ["def \\w+", "\\d+ items"]
        comma = '<tool_call>{"name": "read_file", "arguments": {"path": "a.py",}}; {"name": "read_file", "arguments": {"path": "b.py"}}</tool_call>'
        assert [c.arguments["path"] for c in written(comma)] == ["a.py", "b.py"]

    def test_mending_leaves_a_files_trailing_commas_alone(self):
        """The comma before a closing brace was taken out inside strings too: a Go file's `"b",\\n}`, written
        with raw newlines beside a stray `\\d`, lost its comma (a compile error) and the call still ran."""
        content = '// match \\d\nvar names = []string{\n\t\\"a\\",\n\t\\"b\\",\n}\n'
        call = only(written('<tool_call>{"name": "write_file", "arguments": {"path": "a.go", "content": "' + content + '"}}</tool_call>'))
        assert call.arguments["content"] == '// match \\d\nvar names = []string{\n\t"a",\n\t"b",\n}\n'

    def test_name_and_args_inside_a_calls_strings_is_text(self):
        """`options[ARGS]` in the new text of an edit written in a fence (or as bare JSON) was read as
        Mistral's form: a call to an unknown tool `options`, and the edit dropped at every try."""
        edit = '{"name": "edit_file", "arguments": {"path": "a.py", "old": "x", "new": "value = options[ARGS]\\n"}}'
        for text in (f"```json\n{edit}\n```", edit):
            assert only(written(text)).arguments["new"] == "value = options[ARGS]\n"
        mistral = '[TOOL_CALLS]edit_file[ARGS]{"path": "a.py", "old": "x", "new": "y = f[ARGS]{}"}'
        assert only(written(mistral)).arguments["new"] == "y = f[ARGS]{}"
        two = '[TOOL_CALLS]read_file[ARGS]{"path": "a.py"}read_file[ARGS]{"path": "b.py"}'
        assert [c.arguments["path"] for c in written(two)] == ["a.py", "b.py"]

    @pytest.mark.parametrize("before", ["I'll read the file first. ", "Let me look: ", "- ", "1. ", "`", "<|im_end|>"])
    def test_name_and_args_after_prose_is_a_call_when_it_names_a_tool(self, before):
        """Only a call's usual places counted for a while: after prose on its line, in a list or in
        backticks the call was dropped, and the turn was "you did not call a tool"."""
        assert only(written(before + 'read_file[ARGS]{"path": "a.py"}')).arguments == {"path": "a.py"}

    def test_a_cut_off_file_is_read_in_linear_time(self):
        """A file write cut off by the length limit, its string never closed, full of escaped quotes
        (JSON written into a file): the mend scanned from each of them to the end, 12 s for 40 kB."""
        body = '<tool_call>{"name": "write_file", "arguments": {"path": "d.json", "content": "' + '\\"a\\": \\"b\\", ' * 3300
        started = time.perf_counter()
        broken = only(written(body, finish_reason="length"))
        assert isinstance(broken, BrokenCall) and broken.problem == "unparseable"
        assert time.perf_counter() - started < 3.0

    def test_llama_calls_on_one_line_after_the_python_tag(self):
        text = '<|python_tag|>{"name": "read_file", "parameters": {"path": "a.py"}}; {"name": "read_file", "parameters": {"path": "b.py"}}'
        assert [c.arguments["path"] for c in written(text)] == ["a.py", "b.py"]

    def test_the_tag_named_in_prose_is_no_call(self):
        """Each answer also gave a nameless broken call, and the third stopped a working run (broken_tool_call)."""
        text = 'I will read the file with a <tool_call>.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "app.py"}}\n</tool_call>'
        assert only(written(text)) == ToolCall("read_file", {"path": "app.py"}, source="text")
        after_mention = 'I will use <tool_call> tags now:\n{"name": "read_file", "arguments": {"path": "b.py"}}'
        assert only(written(after_mention)).arguments == {"path": "b.py"}
        # A body written as a call but unreadable is still a broken call, as before.
        assert isinstance(only(written("<tool_call>read_file a.py</tool_call>")), BrokenCall)

    def test_repaired_arguments_keep_a_files_last_newline(self):
        """A regex's `\\d` (no JSON escape) or a trailing comma sent the arguments through the repair
        library, which also dropped the whitespace ending a string: files lost their last newline."""
        call = only(native(("write_file", '{"path": "app.py", "content": "import re\\nx = re.compile(\\"\\d+\\")\\n"}')))
        assert call.arguments["content"] == 'import re\nx = re.compile("\\d+")\n'
        call = only(native(("write_file", '{"path": "app.py", "content": "line1\\n    \\n",}')))
        assert call.arguments["content"] == "line1\n    \n"
        call = only(native(("edit_file", '{"path": "a.py", "old": "    return 41\\n", "new": "    return \\d\\n",}')))
        assert (call.arguments["old"], call.arguments["new"]) == ("    return 41\n", "    return \\d\n")

    @pytest.mark.parametrize(
        "end",
        ["\\n", "\\n\\n", "  \\n", "\\n    \\n", "\n", "\r\n"],
        ids=["newline", "blank-line", "spaces", "indented-blank-line", "raw-newline", "raw-crlf"],
    )
    def test_single_quoted_arguments_the_repair_library_reads_keep_a_files_last_newline(self, end):
        """A single-quoted content holding a quote before a colon (`'x = {'a': 1}\\n'`), which only the repair library
        reads, ran without the white space ending it: the file lost its last newline (git's "No newline at end of file")."""
        meant = "x = {'a': 1}" + end.replace("\\n", "\n")
        arguments = "{'path': 'a.py', 'content': 'x = {'a': 1}" + end + "'}"
        assert only(native(("write_file", arguments))).arguments == {"path": "a.py", "content": meant}
        call = only(written("<tool_call>{'name': 'write_file', 'arguments': " + arguments + "}</tool_call>"))
        assert call.arguments == {"path": "a.py", "content": meant}

    def test_repaired_arguments_whose_content_has_a_backslash_n_before_a_quote_keep_a_files_last_newline(self):
        """Content whose quotes are not escaped and whose string holds `\\n` written as a backslash and an n before a quote
        (C's `printf("%d\\n", 42)`) kept its last newline too: that quote, taken for one after a line break, was marked,
        the marked reading differed, and every mark was dropped."""
        arguments = '{"path": "m.c", "content": "int main(void) {\\n    printf("%d\\\\n", 42);\\n}\\n"}'
        call = only(native(("write_file", arguments)))
        assert call.arguments == {"path": "m.c", "content": 'int main(void) {\n    printf("%d\\n", 42);\n}\n'}

    def test_an_edit_the_repair_library_reads_keeps_each_strings_own_ending(self):
        """Each string of an edit read by the repair library gets back its own trailing white space, and one that ended
        in none (or in an escaped backslash's `n`) gets none."""
        arguments = "{'path': 'a.py', 'old': 'd = {'k': 0}\\n\\n', 'new': 'd = {'k': 1}\\n    \\n'}"
        call = only(native(("edit_file", arguments)))
        assert call.arguments == {"path": "a.py", "old": "d = {'k': 0}\n\n", "new": "d = {'k': 1}\n    \n"}
        arguments = "{'path': 'a.py', 'old': 'd = {'k': 0}\\n', 'new': 'd = {'k': 1}  # ends in \\\\n'}"
        call = only(native(("edit_file", arguments)))
        assert call.arguments == {"path": "a.py", "old": "d = {'k': 0}\n", "new": "d = {'k': 1}  # ends in \\n"}

    def test_a_key_the_repair_library_reads_keeps_its_reading_without_the_line_break_after_it(self):
        """Only a string value gets back the white space ending it: a key read from `'"it's\\n",` is named as the library
        reads it, `'s'`, not `'s\\n'` (the reason the model is told stays the same)."""
        arguments = "{'path': 'a.py', 'old': \n'\"it's\\n\", 'new': \"it is: {'x'}\\n\"}"
        broken = only(native(("edit_file", arguments)))
        assert isinstance(broken, BrokenCall) and broken.problem == "invalid"
        assert broken.detail.endswith("even repaired: unknown parameter 's' (takes: path, old, new)")

    def test_keeping_a_strings_ending_costs_no_quadratic_second_reading(self):
        """The text read again with its marks is read on a budget: 20 kB of `}\\n'\\\\n'` in a list, which the repair
        library reads in 10 ms, took it 7 s marked (each mark a quote it scanned from to the end)."""
        arguments = "{'path': 'a.py', 'content': 'x = {'a': 1}', 'z': ['" + "}\n'\\n'" * 3300 + "']}"
        started = time.perf_counter()
        broken = only(native(("write_file", arguments)))
        assert isinstance(broken, BrokenCall) and broken.detail.endswith("unknown parameter 'z' (takes: path, content)")
        assert time.perf_counter() - started < 2.0

    def test_text_the_repair_library_would_read_quadratically_is_a_broken_call_at_once(self):
        """20 kB of `{'` (a model stuck on two characters) took the repair library 11 s of CPU, every task's thread waiting
        on the GIL, and gave no call worth running: read on a budget, it is unreadable in a fraction of that."""
        for arguments in ("{'" * 10_000, "]'\n{\n]" * 2_800 + "]'"):
            started = time.perf_counter()
            broken = only(native(("write_file", arguments)))
            assert isinstance(broken, BrokenCall)
            assert time.perf_counter() - started < 2.0

    def test_null_for_an_optional_parameter_means_not_given(self):
        call = only(native(("read_file", '{"path": "a.py", "start_line": null, "end_line": null}')))
        assert call == ToolCall("read_file", {"path": "a.py"}, id="call_0", source="native")
        assert isinstance(only(native(("read_file", '{"path": null}'))), BrokenCall)  # required: still wrong

    def test_a_misnamed_parameter_is_named_before_the_missing_one(self):
        broken = only(native(("edit_file", '{"path": "a.py", "old_str": "a", "new_str": "b"}')))
        assert isinstance(broken, BrokenCall) and "unknown parameter 'old_str'" in broken.detail

    def test_a_call_naming_no_tool_is_told_so_plainly(self):
        from guards.broken_call import _correction
        from orchestrator.history import broken_call_note

        broken = only(written("<tool_call>{not json at all</tool_call>"))
        assert isinstance(broken, BrokenCall) and broken.name == ""
        note = broken_call_note(broken, ["read_file"])
        assert "Your call to  " not in note and "names no tool" in note
        assert "Your calls to  " not in _correction(broken) and '"name": "read_file"' in _correction(broken)

    @pytest.mark.parametrize(
        "text",
        [
            '[TOOL_CALLS]read_file[ARGS]{"path": "app.py"}',  # Mistral's newer form
            '[read_file(path="app.py")]',  # Llama 3.2 1B/3B
            '```tool_code\nread_file(path="app.py")\n```',  # Gemma
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>read_file<｜tool▁sep｜>{\"path\": \"app.py\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>read_file\n```json\n{\"path\": \"app.py\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            '{"thought": "I need the file first", "name": "read_file", "arguments": {"path": "app.py"}}',
        ],
    )
    def test_more_families_forms_are_read(self, text):
        """Each was "You did not call a tool", and three of them a no_tool_call stop whose correction told
        the next iteration the wrong thing."""
        assert only(written(text)) == ToolCall("read_file", {"path": "app.py"}, source="text")

    def test_python_calls_only_as_whole_lines_of_tools_outside_python_fences(self):
        calls = written('[read_file(path="a.py"), list_dir(path=".")]')
        assert [(c.name, c.arguments) for c in calls] == [("read_file", {"path": "a.py"}), ("list_dir", {"path": "."})]
        assert written('I will call read_file(path="a.py") next.') == []
        assert written('Like this:\n```python\nwrite_file(path="a.py", content="")\n```') == []
        assert written("print(x)") == []
        positional = only(written('read_file("a.py")'))
        assert isinstance(positional, BrokenCall) and "name every argument" in positional.detail
        assert written('{"thought": "x", "name": "app", "arguments": {}}') == []  # other JSON, not a tool

    @pytest.mark.parametrize(
        "text",
        ['```python\n```\n[read_file(path="a.py")]', '[read_file(path="a.py")]\nOr in Python:\n```python\n'],
    )
    def test_an_empty_python_fence_leaves_the_python_lines_calls(self, text):
        """An empty ```python fence (or one opened as the answer ends) hides no call: its body, nothing, was put in
        place of itself as a line break between every two characters, and the call's line was lost."""
        assert only(written(text)) == ToolCall("read_file", {"path": "a.py"}, source="text")
