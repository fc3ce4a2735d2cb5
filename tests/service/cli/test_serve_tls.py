"""`tandem serve --ssl-certfile --ssl-keyfile [--ssl-keyfile-password]`: what is checked before the start, each
failure one line, and the https:// address announced (the server itself: tests/e2e/test_tls.py)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from service.cli.main import main
from service.config import ServiceConfig

trustme = pytest.importorskip("trustme")  # the test extra's; a bare install skips these


@pytest.fixture(scope="module")
def pems(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """cert.pem and its key.pem; other.pem, another certificate's key; encrypted.pem, key.pem under a password."""
    from cryptography.hazmat.primitives import serialization

    folder = tmp_path_factory.mktemp("pems")
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1")
    issued.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
    issued.private_key_pem.write_to_path(str(folder / "key.pem"))
    ca.issue_cert("127.0.0.1").private_key_pem.write_to_path(str(folder / "other.pem"))
    key = serialization.load_pem_private_key(issued.private_key_pem.bytes(), None)
    (folder / "encrypted.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw")))
    return {p.stem: p for p in folder.iterdir()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("flags, words", [
    (["--ssl-certfile", "cert"], "--ssl-certfile and --ssl-keyfile go together"),
    (["--ssl-keyfile", "key"], "--ssl-certfile and --ssl-keyfile go together"),
    (["--ssl-keyfile-password", "pw"], "--ssl-keyfile-password goes with --ssl-certfile and --ssl-keyfile"),
    (["--ssl-certfile", "cert", "--ssl-keyfile", "missing"], "--ssl-keyfile: cannot read {missing}: No such file"),
    (["--ssl-certfile", "key", "--ssl-keyfile", "cert"], "--ssl-certfile: {key} holds no PEM certificate"),
    (["--ssl-certfile", "cert", "--ssl-keyfile", "other"], "the key is not the certificate's"),
    (["--ssl-certfile", "cert", "--ssl-keyfile", "encrypted", "--ssl-keyfile-password", "pw"],
     "--ssl-keyfile: {encrypted} is encrypted, and this server (granian) reads no encrypted key"),
    (["--ssl-certfile", "cert", "--ssl-keyfile", "key", "--ssl-keyfile-password", "pw"],
     "--ssl-keyfile-password: {key} is not encrypted"),
])
def test_a_bad_certificate_or_key_is_one_line_before_the_start(flags: list[str], words: str, pems: dict[str, Path],
                                                              tiny_llm_dir: Path, served: list[object],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # granian would panic in the worker (a Rust backtrace), or OpenSSL prompt for a key's password on the terminal.
    paths = {**{name: str(path) for name, path in pems.items()}, "missing": str(pems["cert"].parent / "missing.pem")}
    argv = [paths.get(flag, flag) if i % 2 else flag for i, flag in enumerate(flags)]
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--port", str(_free_port()), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and words.format(**paths) in err and "starting on" not in err, err
    assert served == []


def test_a_certificate_and_its_key_announce_https(pems: dict[str, Path], tiny_llm_dir: Path, served: list[object],
                                                  capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                                  ) -> None:
    monkeypatch.chdir(pems["cert"].parent)  # relative paths reach the worker whole: it may start elsewhere
    port = _free_port()
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--port", str(port), "--log-level", "warning",
                 "--ssl-certfile", "cert.pem", "--ssl-keyfile", "key.pem"]) == 0
    config = served[0]
    assert isinstance(config, ServiceConfig) and config.tls and config.ssl_certfile and config.ssl_keyfile
    cert, key = Path(config.ssl_certfile), Path(config.ssl_keyfile)
    assert cert.is_absolute() and cert.samefile(pems["cert"]) and key.samefile(pems["key"])
    assert f"starting on https://127.0.0.1:{port}/v1" in capsys.readouterr().err


@pytest.mark.parametrize("cert, words", [
    ("/dev/zero", "--ssl-certfile: /dev/zero is a character device, not a PEM file"),  # read whole: 8.6 GB in 10 s
    ("folder", "--ssl-certfile: {folder} is a directory, not a PEM file"),
    ("big", "--ssl-certfile: {big} is over 1 MiB, too big for a PEM certificate chain or key"),
    ("", "--ssl-certfile is empty: give the path of a PEM file"),  # it was read as the current directory
])
def test_a_certificate_that_is_no_small_regular_file_is_refused(cert: str, words: str, pems: dict[str, Path],
                                                                tmp_path: Path, tiny_llm_dir: Path,
                                                                served: list[object],
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    if cert == "/dev/zero" and not Path(cert).exists():
        pytest.skip("no /dev/zero here")
    paths = {"folder": tmp_path, "big": tmp_path / "big.pem"}
    # a certificate, then more than a chain ever holds
    paths["big"].write_bytes(pems["cert"].read_bytes() + b"\n" * (1 << 20))
    argv = ["--ssl-certfile", str(paths.get(cert, cert)), "--ssl-keyfile", str(pems["key"])]
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--port", str(_free_port()), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and words.format(**paths) in err, err
    assert served == []


def test_an_empty_key_path_is_refused_by_its_flag(pems: dict[str, Path], tiny_llm_dir: Path, served: list[object],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", str(tiny_llm_dir), "--no-whisper", "--port", str(_free_port()),
                 "--ssl-certfile", str(pems["cert"]), "--ssl-keyfile="]) == 2
    assert "--ssl-keyfile is empty: give the path of a PEM file" in capsys.readouterr().err
    assert served == []


def test_a_fifo_is_refused_without_waiting_for_a_writer(pems: dict[str, Path], tmp_path: Path, tiny_llm_dir: Path,
                                                        served: list[object], capsys: pytest.CaptureFixture[str]) -> None:
    import os
    import threading

    fifo = tmp_path / "fifo.pem"
    os.mkfifo(fifo)
    # A writer that sends nothing: opened for reading, the FIFO was read as empty (with none, the start hung).
    writer = threading.Thread(target=lambda: fifo.open("wb").close())
    writer.start()
    code = main(["serve", str(tiny_llm_dir), "--no-whisper", "--port", str(_free_port()),
                 "--ssl-certfile", str(fifo), "--ssl-keyfile", str(pems["key"])])
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # lets the writer's open return, if it still waits
    writer.join()
    os.close(reader)
    assert code == 2 and f"--ssl-certfile: {fifo} is a FIFO, not a PEM file" in capsys.readouterr().err
    assert served == []
