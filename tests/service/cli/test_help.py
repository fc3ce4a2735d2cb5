"""Every `tandem` flag explains itself and shows its default; help works without optional tools."""

from __future__ import annotations

import argparse

import pytest

from service.cli.main import build_parser, main


def _parsers(parser: argparse.ArgumentParser, name: str = "tandem") -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(name, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                found += _parsers(sub, f"{name} {sub_name}")
    return found


COMMANDS = _parsers(build_parser())


@pytest.mark.parametrize("name, parser", COMMANDS, ids=[name for name, _ in COMMANDS])
def test_every_option_has_help_and_its_default(name: str, parser: argparse.ArgumentParser) -> None:
    formatter = parser.formatter_class(prog=name)
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.dest == argparse.SUPPRESS:
            continue  # nothing to default (--help, --version)
        assert action.help, f"{name}: {action.dest} has no help"
        flag = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
        positional_required = not action.option_strings and action.nargs is None
        if flag or positional_required or action.nargs == argparse.REMAINDER:
            continue
        text = formatter._get_help_string(action) or ""
        assert "(default" in text, f"{name}: {action.dest} does not show its default ({text!r})"


def test_pi_help_works_without_pi(monkeypatch: pytest.MonkeyPatch, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("TANDEM_PI_BIN", raising=False)
    with pytest.raises(SystemExit) as done:
        main(["pi", "--help"])
    out = "".join(capsys.readouterr().out.split())  # help text wraps anywhere, hyphens included
    assert done.value.code == 0
    assert "--serve-model" in out and "npminstall-g@mariozechner/pi-coding-agent" in out


def test_serve_help_shows_host_and_port_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "address to listen on (default: 127.0.0.1)" in out and "port to listen on (default: 8080)" in out


def _serve_help(flag: str, capsys: pytest.CaptureFixture[str]) -> str:
    """The `tandem serve --help` entry of `flag`, on one line."""
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    return text.split(f"{flag} ", 1)[1].split(" --", 1)[0]


def test_the_body_timeout_names_its_minimum_rate(capsys: pytest.CaptureFixture[str]) -> None:
    # A slow upload was answered 408 while its bytes were still arriving, and the help spoke only of silence.
    from service.http.guard import MIN_BODY_RATE

    body = _serve_help("--body-timeout SEC", capsys)
    assert f"{MIN_BODY_RATE} bytes/s" in body and "408" in body, body


def test_the_header_timeout_says_it_is_the_keep_alive_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    # A proxy pooling upstream connections for 60 s reused ones the server had closed at 10 s: 502 for a POST.
    header = _serve_help("--header-timeout SEC", capsys)
    assert "idle keep-alive connection" in header and "keepalive_timeout" in header and "502" in header, header
