"""bench/speech.py's arguments: --reference names a file (its text given instead was a traceback)."""

from __future__ import annotations

import pytest

from bench import speech


def test_reference_text_given_instead_of_a_file_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        speech.main(["--audio", "a.wav", "--reference", "hello there"])
    assert exited.value.code == 2 and "--reference names a file" in capsys.readouterr().err
