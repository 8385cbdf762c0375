"""history.fitted: what a request carries of a long history in a small window."""

from __future__ import annotations

import json
import random

from orchestrator.history import KEPT_OUTPUT_SHARE, LEFT_OUT, argument_left_out, fitted

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
    """Thirty reads: what the tool messages carry, the lines standing for the outputs left out included, stays within the 40%."""
    request = fitted(history([900] * 30), WINDOW)
    carried = sum(len(m["content"]) for m in request[2:] if m["role"] == "tool")
    assert carried <= ROOM, carried


def test_an_output_shorter_than_the_line_stays() -> None:
    request = fitted(history([CAP, 12, CAP, CAP, CAP]), WINDOW)
    assert request[5]["content"] == "x" * 12 and request[3]["content"] == LEFT_OUT


def test_the_task_and_the_newest_two_are_never_left_out() -> None:
    request = fitted(history([CAP] * 12), WINDOW)
    assert request[1]["content"] == "task" and request[-1]["content"] == "x" * CAP and request[-3]["content"] == "x" * CAP


def writes(contents: list[str], text_mode: bool = False) -> list[dict]:
    """A history of write_file calls, natively or as written `<tool_call>` text, each answered briefly."""
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    for i, content in enumerate(contents):
        arguments = json.dumps({"path": f"f{i}.py", "content": content})
        if text_mode:
            call = json.dumps({"name": "write_file", "arguments": {"path": f"f{i}.py", "content": content}})
            messages.append({"role": "assistant", "content": f"Writing it.\n<tool_call>{call}</tool_call>"})
            messages.append({"role": "user", "content": f"Result of write_file (ok):\nwrote f{i}.py"})
        else:
            messages.append({"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "write_file", "arguments": arguments}}]})
            messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"wrote f{i}.py"})
    return messages


def carried(request: list[dict]) -> int:
    """What a request carries of the model's calls' arguments and the tools' outputs."""
    total = 0
    for message in request[2:]:
        total += len(message.get("content") or "")
        total += sum(len(call["function"]["arguments"]) for call in message.get("tool_calls") or ())
    return total


def test_files_written_long_ago_leave_a_small_window_too() -> None:
    """Ten files of 3000 characters written whole: 30000 characters of arguments, two and a half times a
    4096-token window, went into every request (the server refused the eighth). The oldest calls keep their
    name and path, their content stands as a short line, and the arguments still parse."""
    contents = [f"# file {i}\n" + "x = 1\n" * 500 for i in range(10)]
    request = fitted(writes(contents), WINDOW)
    newest_two = sum(len(json.dumps({"path": f"f{i}.py", "content": contents[i]})) for i in (8, 9))
    assert carried(request) - newest_two <= ROOM
    calls = [m["tool_calls"][0]["function"] for m in request if m.get("tool_calls")]
    arguments = [json.loads(call["arguments"]) for call in calls]
    assert [a["path"] for a in arguments] == [f"f{i}.py" for i in range(10)]
    assert arguments[-1]["content"] == contents[-1] and arguments[-2]["content"] == contents[-2]
    assert arguments[0]["content"] == argument_left_out(len(json.dumps(contents[0])) - 2)
    assert writes(contents)[2]["tool_calls"][0]["function"]["arguments"] == json.dumps({"path": "f0.py", "content": contents[0]})


def test_a_written_call_in_text_is_shortened_the_same_way() -> None:
    contents = ["y = 2\n" * 500 for _ in range(10)]
    request = fitted(writes(contents, text_mode=True), WINDOW)
    assert carried(request) - len(request[-2]["content"]) - len(request[-4]["content"]) <= ROOM
    first = request[2]["content"]
    assert first.startswith("Writing it.\n<tool_call>") and "left out to save room" in first
    assert json.loads(first.split("<tool_call>")[1].split("</tool_call>")[0])["arguments"]["path"] == "f0.py"
    assert "y = 2" * 3 not in first and request[-2]["content"].count("y = 2") == 500


def test_short_arguments_and_a_large_window_are_left_as_they_are() -> None:
    contents = ["z" * 150] * 30
    assert fitted(writes(contents), WINDOW) == writes(contents)
    contents = ["z" * 3000] * 10
    assert fitted(writes(contents), 128_000) == writes(contents)


def test_reads_and_writes_mixed_are_left_out_oldest_first_and_never_come_back() -> None:
    rng = random.Random(5)
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    before: set[int] = set()
    for i in range(30):
        if rng.random() < 0.5:
            arguments = json.dumps({"path": f"f{i}.py", "content": "w" * rng.choice([50, 800, 2500])})
            output = "ok"
        else:
            arguments, output = json.dumps({"path": f"f{i}.py"}), "r" * rng.choice([30, 900, CAP])
        messages.append({"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": arguments}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": output})
        request = fitted(messages, WINDOW)
        now = {at for at, m in enumerate(request) if m != messages[at]}
        assert before <= now, f"turn {i}: {sorted(before - now)} back"
        assert carried(request) <= ROOM + 2 * CAP + 2 * 2600, i
        before = now


def test_a_file_written_early_does_not_keep_every_output_after_it() -> None:
    """The newest two calls' arguments are kept whole, and the cut used to stop at them as at a wall:
    one file written before nine reads of 1500 characters kept all nine in the request (15000
    characters, more than the 4096-token window itself)."""
    messages = writes(["w" * 1500])
    for i in range(9):
        messages.append({"role": "assistant", "content": "", "tool_calls": [{"id": f"r{i}", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": f"r{i}.py"})}}]})
        messages.append({"role": "tool", "tool_call_id": f"r{i}", "content": "r" * 1500})
    request = fitted(messages, WINDOW)
    assert carried(request) <= ROOM + 2 * 1500, carried(request)
    assert request[-1]["content"] == "r" * 1500 and request[-3]["content"] == "r" * 1500
    assert json.loads(request[2]["tool_calls"][0]["function"]["arguments"])["content"] == "w" * 1500  # one of the newest two calls


def test_prose_quotes_in_a_written_turn_do_not_swallow_its_call() -> None:
    """A closing quote in the model's prose was taken for a string's start, and the "string" from it ran
    over `<tool_call>` and the call's first key: the old turn, which small models copy, lost its form."""
    prose = 'The "parser" fails, the log says "Error:" because ' + "the tokens are read in the wrong order and the state is lost " * 4
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    for i in range(10):
        call = json.dumps({"name": "write_file", "arguments": {"path": f"f{i}.py", "content": "v = 1\n" * 300}})
        messages.append({"role": "assistant", "content": f'{prose}. Writing "f{i}.py" now.\n<tool_call>\n{call}\n</tool_call>'})
        messages.append({"role": "user", "content": f"Result of write_file (ok):\nwrote f{i}.py"})
    first = fitted(messages, WINDOW)[2]["content"]
    assert "left out to save room" in first and first.startswith(prose) and "<tool_call>\n{" in first
    call = json.loads(first.split("<tool_call>")[1].split("</tool_call>")[0])
    assert call["name"] == "write_file" and call["arguments"]["path"] == "f0.py"


def test_a_long_task_message_is_never_left_out() -> None:
    """The task (the second message: the prompt and the notes carried forward) is no tool's output: however
    long, and however many outputs come after it, every request carries it whole."""
    task = "Make greet() return 'hello'.\n\n" + "Earlier attempts at this task failed. " * 60
    messages = history([CAP] * 12)
    messages[1] = {"role": "user", "content": task}
    request = fitted(messages, WINDOW)
    assert request[1] == {"role": "user", "content": task}
    assert request[3]["content"] == LEFT_OUT  # the window was tight: old outputs did go


def test_a_long_run_counts_the_lines_standing_for_outputs_and_arguments() -> None:
    """Ninety turns (a raised max_turns) of short outputs or of short files written: the stand-in lines add up,
    and counted they keep what the request carries of outputs and arguments within the share (the newest two
    of each always whole); uncounted, they took 3000 characters more."""
    for turn in range(1, 91):
        request = fitted(history([200] * turn), WINDOW)
        assert sum(len(m["content"]) for m in request[2:] if m["role"] == "tool") <= ROOM + 2 * 200, turn
    for turn in range(1, 91):
        request = fitted(writes(["q" * 260] * turn), WINDOW)
        arguments = [json.loads(m["tool_calls"][0]["function"]["arguments"]) for m in request if m.get("tool_calls")]
        weight = sum(len(json.dumps(a["content"])) for a in arguments) + sum(len(m["content"]) for m in request if m["role"] == "tool")
        assert weight <= ROOM + 2 * 262, turn


def test_a_broken_call_with_no_text_still_leaves_a_turn_that_says_what_happened() -> None:
    """A call whose arguments did not parse is never sent back as a tool call, and an answer that was only that
    call is not sent back empty: the turn says a call was tried and could not be used."""
    from orchestrator.history import assistant_turn
    from orchestrator.records import BrokenCall, ModelResponse, ToolCall

    broken = BrokenCall(name="write_file", problem="unparseable", detail="Expecting value", raw_arguments="{{{")
    turn = assistant_turn(ModelResponse(text=""), [broken], turn=3)
    assert "tool_calls" not in turn.assistant and "could not be used" in turn.assistant["content"]
    native = ToolCall(name="read_file", arguments={"path": "a.py"}, id="srv-7", source="native")
    turn = assistant_turn(ModelResponse(text="Reading."), [native, broken], turn=3)
    assert turn.assistant["content"] == "Reading."
    assert [c["id"] for c in turn.assistant["tool_calls"]] == ["srv-7"] and turn.ids == {id(native): "srv-7"}


def test_the_model_is_told_which_tool_did_not_exist_and_which_do() -> None:
    from orchestrator.history import broken_call_note, text_call_result
    from orchestrator.records import BrokenCall, ToolCall, ToolResult

    note = broken_call_note(BrokenCall(name="bash", problem="unknown_tool", detail="", raw_arguments=""), ["read_file", "submit"])
    assert "There is no tool named 'bash'" in note and "read_file, submit" in note
    note = broken_call_note(BrokenCall(name="", problem="empty_tool_name", detail="", raw_arguments=""), ["read_file", "submit"])
    assert "no tool name" in note and "read_file, submit" in note
    call = ToolCall(name="run_check", arguments={}, source="text")
    assert text_call_result(call, ToolResult(ok=False, output="exit 1")) == "Result of run_check (failed):\nexit 1"
    assert text_call_result(call, ToolResult(ok=True, output="passed")) == "Result of run_check (ok):\npassed"


def test_every_reminder_of_a_turn_goes_with_the_next_request_and_none_is_stored() -> None:
    from orchestrator.history import with_reminders

    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}, {"role": "assistant", "content": "Hmm."}]
    request = with_reminders(messages, ["one tool at a time", "run the check"])
    assert request[-1] == {"role": "user", "content": "Reminder: one tool at a time\nReminder: run the check"}
    text_mode = [*messages, {"role": "user", "content": "Result of read_file (ok):\nx"}]
    request = with_reminders(text_mode, ["run the check"])
    assert len(request) == 4 and request[-1]["content"] == "Result of read_file (ok):\nx\n\nReminder: run the check"
    assert text_mode[-1]["content"] == "Result of read_file (ok):\nx" and len(messages) == 3
