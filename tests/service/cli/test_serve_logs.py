"""`tandem serve` writes granian's log lines to stderr, beside tandem's own: stdout stays for what scripts read."""

from __future__ import annotations

import logging
import multiprocessing
from pathlib import Path

import pytest

from service.cli.main import main


def _serve_logs_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, level: int) -> None:
    """`tandem serve` as configured, but granian's serve() only logs its listening line at `level`."""
    from service.config import CONFIG_ENV
    from service.process.parent import PARENT_PID_ENV
    from service.process.supervisor import SupervisedGranian

    def serve(self: SupervisedGranian) -> None:  # the server as configured, but nothing started
        logging.getLogger("_granian").log(level, "Listening at: http://127.0.0.1:1")

    monkeypatch.setattr(SupervisedGranian, "serve", serve)
    monkeypatch.setattr(multiprocessing, "set_start_method", lambda *args, **kwargs: None)
    for name in (CONFIG_ENV, PARENT_PID_ENV):  # serve() sets them for the worker; restored after the test
        monkeypatch.setenv(name, "")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # serve()'s start-up cleanup looks there


def test_granians_lines_go_to_stderr_with_their_content(tiny_llm_dir: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capfd: pytest.CaptureFixture[str]) -> None:
    # granian's own configuration (built in its server's constructor, handed to its workers) wrote them to stdout.
    _serve_logs_only(monkeypatch, tmp_path, logging.INFO)
    try:
        assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--port", "0"]) == 0
    finally:
        logging.getLogger("_granian").handlers.clear()  # bound to this test's captured stream
    out, err = capfd.readouterr()
    assert out == ""
    assert "[INFO] Listening at: http://127.0.0.1:1\n" in err and "tandem: starting on http://" in err, err


@pytest.mark.parametrize("level", ["info", "warning"])
def test_log_format_json_makes_every_stderr_line_a_json_object(tiny_llm_dir: Path, tmp_path: Path, level: str,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capfd: pytest.CaptureFixture[str]) -> None:
    # Log collectors (Loki, Datadog...) read the level and time of each line; granian's came as `[INFO] ...`.
    import json

    from service.logs import configure_logging

    _serve_logs_only(monkeypatch, tmp_path, logging.WARNING)
    try:
        assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--port", "0", "--log-format", "json",
                     "--log-level", level]) == 0
    finally:
        logging.getLogger("_granian").handlers.clear()
        configure_logging("info")
    out, err = capfd.readouterr()
    lines = [json.loads(line) for line in err.splitlines()]
    assert out == "" and all({"time", "level", "logger", "message"} <= set(line) for line in lines), err
    assert {"level": "WARNING", "logger": "_granian", "message": "Listening at: http://127.0.0.1:1"}.items() <= \
        lines[-1].items(), err
    # The address, at any level.
    assert any(line["message"].startswith("starting on http://") for line in lines), err
