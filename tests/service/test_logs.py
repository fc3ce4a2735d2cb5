"""Log lines: `--log-format text` (the default) as before, `tandem: message`; json one object a line, with time,
level, logger and message, for our loggers, granian's and the root logger's."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any, Iterator

import pytest

from service.cli.main import build_parser
from service.config import ServiceConfig
from service.logs import configure_logging, granian_log_config

# RFC 3339, UTC, milliseconds.
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


@pytest.fixture(autouse=True)
def _text_after() -> Iterator[None]:
    yield
    configure_logging("info")  # the next test's loggers as every other test expects them
    for name in ("_granian", "granian.access"):  # bound to this test's captured stream
        logging.getLogger(name).handlers.clear()


def _objects(err: str) -> list[dict[str, Any]]:
    """Every stderr line as JSON (fails on one that is not)."""
    return [json.loads(line) for line in err.splitlines()]


def test_text_stays_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info", "json")
    configure_logging("info")  # the last call's format wins
    logging.getLogger("tandem.service").info("starting on %s", "http://127.0.0.1:1/v1")
    logging.getLogger("tandem.access").info("GET /health 200 0.5 ms", extra={"method": "GET"})
    assert capsys.readouterr().err == "tandem: starting on http://127.0.0.1:1/v1\ntandem: GET /health 200 0.5 ms\n"
    assert not [h for h in logging.getLogger().handlers if type(h).__module__ == "service.logs"]
    assert granian_log_config()["formatters"]["generic"]["fmt"] == "[%(levelname)s] %(message)s"


def test_json_lines_of_our_loggers(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info", "json")
    log = logging.getLogger("engine.probe")
    log.info("loaded %s", "model", extra={"rows": 3})
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("step failed")
    log.debug("not at info")
    logging.getLogger("some.library").warning("a library's \"warning\"\nover two lines")
    first, failed, library = _objects(capsys.readouterr().err)
    assert _TIME.fullmatch(first.pop("time")), first
    assert first == {"level": "INFO", "logger": "engine.probe", "message": "loaded model", "rows": 3}
    assert (failed["level"], failed["message"]) == ("ERROR", "step failed")
    assert failed["exc_info"].startswith("Traceback") and failed["exc_info"].endswith("ValueError: boom")
    assert (library["level"], library["logger"]) == ("WARNING", "some.library")
    assert library["message"] == "a library's \"warning\"\nover two lines"


def test_json_lines_of_granians_loggers(capsys: pytest.CaptureFixture[str]) -> None:
    # granian's worker and supervisor configure these from log_dictconfig.
    from granian.log import LogLevels, configure_logging as granian_logging

    granian_logging(LogLevels.info, granian_log_config("json"))
    logging.getLogger("_granian").info("Listening at: http://127.0.0.1:1")
    logging.getLogger("granian.access").info("%(method)s %(path)s %(status)d", {"method": "GET", "path": "/x",
                                                                                  "status": 200, "dt_ms": 1.5})
    out, err = capsys.readouterr()
    listening, access = _objects(err)
    assert out == "" and _TIME.fullmatch(listening["time"])
    assert (listening["level"], listening["logger"], listening["message"]) == \
        ("INFO", "_granian", "Listening at: http://127.0.0.1:1")
    assert access["message"] == "GET /x 200" and (access["method"], access["path"], access["status"],
                                                  access["dt_ms"]) == ("GET", "/x", 200, 1.5)


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_granians_line_for_a_websocket_its_client_cut_is_dropped(capsys: pytest.CaptureFixture[str],
                                                                  log_format: str) -> None:
    # Each websocket a proxy or client cut before the close handshake added a granian line with no request id beside
    # the access log's own line for it (21 for 28 sockets).
    from granian.log import LogLevels, configure_logging as granian_logging

    granian_logging(LogLevels.info, granian_log_config(log_format))
    granian = logging.getLogger("_granian")
    granian.info('Failed to close websocket with error Io(Os { code: 32, kind: BrokenPipe, message: "Broken pipe" })')
    logging.getLogger("_granian.asgi.io").info("Attempted to write to a closed websocket")
    granian.info("Stopped worker-1")
    granian.warning("Failed to close websocket with error Timeout")  # above info: kept
    _, err = capsys.readouterr()
    assert "BrokenPipe" not in err and "closed websocket" not in err and "Stopped worker-1" in err and "Timeout" in err


def test_a_command_that_cannot_start_says_so_as_json_under_log_format_json(capsys: pytest.CaptureFixture[str],
                                                                          tmp_path: Path) -> None:
    # "tandem: no model: ..." came as text though every other line was JSON: the one a log pipeline most needs.
    from service.cli.main import main

    try:
        assert main(["serve", str(tmp_path / "no-such-model"), "--log-format", "json"]) == 2
        err = capsys.readouterr().err
        (line,) = _objects(err)
        assert line["level"] == "ERROR" and line["message"].startswith("no model:"), err
        assert main(["serve", str(tmp_path / "no-such-model")]) == 2
        assert capsys.readouterr().err.startswith("tandem: no model:")  # text as before
    finally:
        configure_logging("info")


def test_log_format_is_a_flag_of_every_command_and_reaches_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.cli.serve import serve_config

    parser = build_parser()
    assert parser.parse_args(["openapi", "--check"]).log_format == "text"
    args = parser.parse_args(["serve", "--log-format", "JSON"])
    config = serve_config(args)
    assert config.log_format == "json" and ServiceConfig.from_env({"TANDEM_SERVE_CONFIG": config.to_json()}) == config
    assert ServiceConfig.from_env({"TANDEM_LOG_FORMAT": "json"}).log_format == "json"  # granian ... app_from_env
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--log-format", "xml"])
    with pytest.raises(ValueError, match="log format"):
        configure_logging("info", "xml")
