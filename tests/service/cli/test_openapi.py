"""`tandem openapi --output`: a path that cannot be written is one line, never a traceback."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from service.cli.main import main


def test_an_output_that_cannot_be_written_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `--output /proc/o.json` was a FileNotFoundError traceback (exit 1).
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for output in (tmp_path, blocker / "spec.json"):  # a directory; a "directory" that is a file
        assert main(["openapi", "--output", str(output)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"tandem: cannot write {output}: ") and err.count("\n") == 1, err


def test_a_disk_that_fails_the_write_is_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import service.openapi_document

    def full(path: Path) -> Path:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(service.openapi_document, "write_openapi", full)
    assert main(["openapi", "--output", str(tmp_path / "spec.json")]) == 1
    assert capsys.readouterr().err == f"tandem: cannot write {tmp_path / 'spec.json'}: No space left on device\n"


def test_checking_a_file_that_is_not_text_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `--check --output model.gguf` was a UnicodeDecodeError traceback.
    binary = tmp_path / "fake.gguf"
    binary.write_bytes(b"GGUF\xff\xfe\x00\x01")
    assert main(["openapi", "--check", "--output", str(binary)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tandem: cannot check {binary}: it is not UTF-8 text") and err.count("\n") == 1, err
