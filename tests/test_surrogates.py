"""Half a surrogate pair from the model becomes text every file and database can take."""

from __future__ import annotations

import json

from orchestrator.surrogates import mend, mend_all


def test_text_without_surrogates_is_the_same_object():
    """The usual case costs one encode and changes nothing."""
    text = "plain text, ünïcode and 😀"
    assert mend(text) is text


def test_a_pair_split_in_two_is_joined():
    """Two halves that meet again (a pair split across stream chunks) become their one character."""
    halves = json.loads('"\\ud83d"') + json.loads('"\\ude00"')
    assert mend("smile " + halves) == "smile 😀"


def test_a_lone_half_becomes_its_escape():
    """A lone half is written as the six characters of its escape, and then encodes as UTF-8."""
    mended = mend("S = " + json.loads('"\\ud83d"') + "!")
    assert mended == "S = \\ud83d!" and mended.encode("utf-8")


def test_every_string_of_a_value_is_mended():
    """Keys and values, at any depth; other types untouched."""
    lone = json.loads('"\\udc80"')
    value = {"a" + lone: [1, None, {"b": "x" + lone}], "n": 2.5}
    assert mend_all(value) == {"a\\udc80": [1, None, {"b": "x\\udc80"}], "n": 2.5}


def test_the_transcript_writes_a_stray_half_as_its_escape(tmp_path):
    """The last line of defence: a lone surrogate that reached the transcript is written as its JSON
    escape (the line still parses, to the same string), not raised."""
    from orchestrator.transcript import Transcript

    lone = json.loads('"\\ud83d"')
    with Transcript(tmp_path / "t.jsonl") as transcript:
        transcript.write("tool_call", output="name " + lone)
    [line] = (tmp_path / "t.jsonl").read_text(encoding="utf-8").splitlines()
    assert json.loads(line)["output"] == "name " + lone
