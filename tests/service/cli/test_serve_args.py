"""`tandem serve` arguments: an empty key, a queue bound of 0, the help's
defaults, the address at any log level, and a bad --host reported alone."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from service.cli.main import main


@pytest.fixture
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """service.server.serve returns at once: a check that fails to refuse does not start a real server."""
    import service.server

    monkeypatch.setattr(service.server, "serve", lambda config: 0)


@pytest.mark.parametrize("key", ["", " ", ","])
def test_an_empty_api_key_is_refused(key: str, tiny_llm_dir: Path, no_server: None,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--port", str(_free_port()), "--api-key", key]) == 2
    assert "--api-key is empty" in capsys.readouterr().err


def test_a_queue_bound_of_zero_is_taken(capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli.main import build_parser
    from service.cli.serve import serve_config

    # the engine serves a free row at once (e8cd0d8), so 0 means "none wait", not "refuse everything"
    assert serve_config(build_parser().parse_args(["serve", "--max-queued", "0"])).queue_limit == 0
    assert main(["serve", "--max-queued", "-1"]) == 2
    assert "--max-queued must be >= 0" in capsys.readouterr().err


def test_the_help_states_each_default_once(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = re.sub(r"\s+", " ", capsys.readouterr().out)
    for flag in ("--prefill-stall X", "--decode-burst N"):
        entry = text.split(flag, 2)[2].split(" --", 1)[0]  # the option's entry (its first mention is the usage)
        assert entry.count("default") == 1, entry


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_address_prints_at_any_log_level(tiny_llm_dir: Path, no_server: None,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    port = _free_port()
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--port", str(port), "--log-level", "warning"]) == 0
    assert f"http://127.0.0.1:{port}/v1" in capsys.readouterr().err


def test_a_bad_host_is_the_one_line_printed(tiny_llm_dir: Path, no_server: None, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("TANDEM_API_KEY", raising=False)

    def unresolvable(*args: object, **kwargs: object) -> None:
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unresolvable)
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--host", "bogus.invalid"]) == 2
    err = capsys.readouterr().err
    assert "cannot resolve --host" in err and "without an API key" not in err, err
