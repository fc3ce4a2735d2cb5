"""bench/json_lines.py: each result printed as it comes, and the file holds every result so far after each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.json_lines import JsonLines


def test_each_line_is_printed_and_the_file_rewritten_after_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    lines = JsonLines(out)
    lines.add({"a": 1})
    assert json.loads(out.read_text()) == [{"a": 1}]  # a run cut off here keeps its first result
    lines.add({"a": 2})
    assert json.loads(out.read_text()) == [{"a": 1}, {"a": 2}]
    assert [json.loads(x) for x in capsys.readouterr().out.splitlines()] == [{"a": 1}, {"a": 2}]
    JsonLines(None).add({"b": 3})  # no file: printed only
    assert json.loads(capsys.readouterr().out) == {"b": 3}
