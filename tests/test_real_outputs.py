"""What the real embedded model (Gemma 3 270M) emitted, run through the call parser as regression tests.

Each fixture in tests/data/real_outputs/ is a ModelResponse recorded from a demo
night; its "source" field says where it came from.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.records import BrokenCall, ModelResponse, RawToolCall, ToolCall
from orchestrator.tool_names import DEFAULT_TOOLS
from orchestrator.toolcalls import parse_calls
from orchestrator.tools import Toolbox

DATA = Path(__file__).parent / "data" / "real_outputs"


def recorded(name: str) -> ModelResponse:
    fields = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    fields.pop("source")
    fields["tool_calls"] = tuple(RawToolCall(**call) for call in fields["tool_calls"])
    return ModelResponse(**fields)


@pytest.fixture(scope="module")
def schemas(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    toolbox = Toolbox(tmp_path_factory.mktemp("wt"), (*DEFAULT_TOOLS, "submit"), check_command="true", check_timeout_s=5, command_timeout_s=5)
    return toolbox.schemas()


class TestRecordedGemmaOutputs:
    def test_many_calls_at_once_keep_their_order_and_the_cut_one_is_broken(self, schemas: list[dict]) -> None:
        """Fifteen native calls in one reply: fourteen run in order, the last, cut at max_tokens, is a BrokenCall."""
        calls = parse_calls(recorded("many_calls_last_cut_off"), schemas)
        assert len(calls) == 15
        assert all(isinstance(c, ToolCall) and c.source == "native" for c in calls[:-1])
        assert [c.name for c in calls[:4]] == ["read_file", "edit_file", "run_check", "submit"]
        last = calls[-1]
        assert isinstance(last, BrokenCall) and (last.name, last.problem) == ("run_check", "unparseable")
        assert "cut off" in last.detail

    def test_a_runaway_write_cut_at_the_limit_is_not_executed(self, schemas: list[dict]) -> None:
        """A write_file whose content loops until the length limit is reported broken, never written half-way."""
        calls = parse_calls(recorded("junk_write_cut_off"), schemas)
        write = calls[-1]
        assert isinstance(write, BrokenCall) and write.name == "write_file" and write.problem == "unparseable"
        assert not any(isinstance(c, ToolCall) and c.name == "write_file" for c in calls)

    def test_invented_tool_responses_in_text_are_not_calls(self, schemas: list[dict]) -> None:
        """Text that imitates <tool_response> turns and the check's output holds no call at all."""
        response = recorded("fake_tool_response_text")
        assert "<tool_response>" in response.text and not response.tool_calls
        assert parse_calls(response, schemas) == []
