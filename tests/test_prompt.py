"""What the model is told at the start of an iteration (orchestrator/prompt.py)."""

from __future__ import annotations

from orchestrator.agent import NO_TOOL_CALLED
from orchestrator.prompt import build_messages
from orchestrator.tool_names import DEFAULT_TOOLS
from orchestrator.toolcalls import parse_calls
from orchestrator.records import ModelResponse
from orchestrator.tool_schemas import offered, schemas_of


def system_prompt(tools: list[str]) -> str:
    return build_messages(task_prompt="t", check="true", tool_names=tools, notes="")[0]["content"]


def test_the_prompt_names_only_the_tasks_tools() -> None:
    """A task with read_file, write_file and submit: the steps and the worked example name no other tool (a small
    model copies the example: list_dir or edit_file would be unknown tools, two of which in a row stop the run)."""
    text = system_prompt(["read_file", "write_file", "submit"])
    for absent in ("list_dir", "edit_file", "run_check", "search", "run_command"):
        assert absent not in text, absent
    assert 'you call write_file with {"path": "app.py"' in text and "call submit with a one-line summary" in text


def test_the_default_tools_get_the_whole_example() -> None:
    text = system_prompt(offered(DEFAULT_TOOLS))
    assert all(f"you call {name} with" in text for name in ("list_dir", "read_file", "edit_file", "run_check", "submit"))


def test_the_written_call_form_the_prompt_shows_is_one_the_parser_takes() -> None:
    """A server that does not parse tool calls: the form the prompt shows, copied, runs."""
    text = system_prompt(offered(DEFAULT_TOOLS))
    shown = next(line for line in text.splitlines() if line.startswith("<tool_call>"))
    [parsed] = parse_calls(ModelResponse(text=shown), schemas_of(offered(DEFAULT_TOOLS)))
    assert (parsed.name, parsed.arguments) == ("read_file", {"path": "app.py"})
    assert "submit(summary)" not in NO_TOOL_CALLED


def test_the_written_call_form_names_a_tool_the_task_offers() -> None:
    """Without read_file (a task of edit_file, run_check and submit), the written form named read_file anyway:
    copied, an unknown tool, two of which in a row stop the run."""
    for tools in (["edit_file", "run_check", "submit"], ["write_file", "submit"], ["submit", "run_command"], ["submit"]):
        text = system_prompt(offered(tools))
        shown = next(line for line in text.splitlines() if line.startswith("<tool_call>"))
        [parsed] = parse_calls(ModelResponse(text=shown), schemas_of(offered(tools)))
        assert parsed.name in tools and "read_file" not in text, (tools, parsed)


def test_the_first_attempt_is_not_told_of_earlier_failures_and_a_later_one_gets_its_notes() -> None:
    first = build_messages(task_prompt="Fix greet().", check="pytest -q", tool_names=offered(DEFAULT_TOOLS), notes="  \n")[1]["content"]
    assert first == "Task:\nFix greet().\n\nThe task is done when this check passes: `pytest -q`"
    notes = "## 2026-01-01 02:00 UTC · task `t` · iteration 1 · `check_failed`\n\n**Correction:** Read the check's output."
    later = build_messages(task_prompt="Fix greet().", check="pytest -q", tool_names=offered(DEFAULT_TOOLS), notes=notes)[1]["content"]
    assert later.startswith(first + "\n\n") and "failed and were rolled back" in later and later.endswith(notes)


def test_the_prompt_lists_every_tool_and_without_run_check_says_the_check_runs_at_submit() -> None:
    tools = ["read_file", "write_file", "submit"]
    text = system_prompt(tools)
    assert "Tools you have: read_file, write_file, submit." in text
    assert "When the task is done, call submit with a one-line summary; the check then runs." in text
    text = system_prompt(offered(DEFAULT_TOOLS))
    assert "Call run_check to see whether the task is done." in text and "Do not submit before." in text
