"""bench/chat.py's options: a mistake is argparse's usage error (exit 2), never a traceback mid-run."""

from __future__ import annotations

import pytest

import bench.chat
from bench.chat import cli


def test_levels_are_positive_integers() -> None:
    assert bench.chat.stream_levels("1,4,8") == (1, 4, 8)
    assert bench.chat.stream_levels(" 2, 16") == (2, 16)


@pytest.mark.parametrize("options", [["--levels", "abc"], ["--levels", "0"], ["--levels", "1,,4"],
                                     ["--levels", "-1"], ["--max-tokens", "0"]])
def test_a_bad_option_is_a_usage_error_before_anything_runs(options: list[str], monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # --levels abc was a ValueError traceback; --levels 0 started a server, then failed in statistics.mean.
    ran: list[object] = []
    monkeypatch.setattr(bench.chat, "main", lambda *a: ran.append(a))
    with pytest.raises(SystemExit) as done:
        cli([*options, "--no-peer"])
    assert done.value.code == 2 and not ran
    err = capsys.readouterr().err
    assert f"argument {options[0]}" in err and "Traceback" not in err, err


def test_good_options_reach_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[tuple[object, ...]] = []
    monkeypatch.setattr(bench.chat, "main", lambda *a: ran.append(a))
    assert cli(["--levels", "2,3", "--max-tokens", "5", "--no-peer"]) == 0
    assert ran == [(None, (2, 3), 5, None, False)]
