"""The HTTPS flags of `tandem serve` (uvicorn's and vLLM's names): a certificate and its key put HTTPS and WSS on the
port, which browsers need for a microphone on another machine and openai-node's Node Realtime client always uses.
Both files are checked here, so a bad one is one line before the start, not a Rust panic in the worker."""

from __future__ import annotations

import argparse
import os
import ssl
import stat
from pathlib import Path

from service.cli.errors import CLIError
from service.config import ServiceConfig

__all__ = ["add_serve_tls_args", "configure_serve_tls"]

# What granian 2.8.9 loads: every PEM certificate in the chain file, and an unencrypted PEM key (PKCS#8, PKCS#1 or
# SEC1). Its encrypted-key reader rejects the PKCS#8 that OpenSSL 3 writes, its own test key included.
_CERT_MARK = b"-----BEGIN CERTIFICATE-----"
_KEY_MARK = b"PRIVATE KEY-----"
_ENCRYPTED_MARKS = (b"-----BEGIN ENCRYPTED PRIVATE KEY-----", b"Proc-Type: 4,ENCRYPTED")
# A chain or a key is a few kB: a bigger file is neither, and read whole (/dev/zero never ends) it could fill the RAM.
_MAX_PEM_BYTES = 1 << 20
# What a path that is not a regular file names, as the refusal says it (it would block, never end, or is no file).
_NOT_FILES = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
              (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def add_serve_tls_args(p: argparse.ArgumentParser) -> None:
    """Register the flags. Raises nothing."""
    t = p.add_argument_group("https")
    t.add_argument("--ssl-certfile", default=None, metavar="PEM",
                   help="serve HTTPS and WSS on the port with this certificate (its chain after it), e.g. from "
                        "mkcert; needs --ssl-keyfile (default: plain HTTP)")
    t.add_argument("--ssl-keyfile", default=None, metavar="PEM",
                   help="the certificate's private key, unencrypted (keep it readable only by you) (default: none)")
    t.add_argument("--ssl-keyfile-password", default=None, metavar="PW",
                   help="taken for uvicorn's and vLLM's command lines, and refused: this server (granian) reads no "
                        "encrypted key; decrypt it with `openssl pkey -in KEY -out PLAIN` (default: none)")


def configure_serve_tls(args: argparse.Namespace, config: ServiceConfig) -> None:
    """Check the certificate and key and put their paths on `config`. Raises CLIError: one flag without the other, a
    file that cannot be read or holds no PEM certificate / key, an encrypted key, a key not the certificate's."""
    cert, key = args.ssl_certfile, args.ssl_keyfile
    for flag, value in (("--ssl-certfile", cert), ("--ssl-keyfile", key)):
        if value == "":  # Path("") is the current directory
            raise CLIError(f"{flag} is empty: give the path of a PEM file")
    if (cert is None) != (key is None):
        raise CLIError("--ssl-certfile and --ssl-keyfile go together: give both (HTTPS) or neither (HTTP)")
    if cert is None:
        if args.ssl_keyfile_password is not None:
            raise CLIError("--ssl-keyfile-password goes with --ssl-certfile and --ssl-keyfile")
        return
    cert_path, cert_pem = _read("--ssl-certfile", cert)
    key_path, key_pem = _read("--ssl-keyfile", key)
    if _CERT_MARK not in cert_pem:
        raise CLIError(f"--ssl-certfile: {cert_path} holds no PEM certificate ({_CERT_MARK.decode()})")
    if _KEY_MARK not in key_pem:
        raise CLIError(f"--ssl-keyfile: {key_path} holds no PEM private key (-----BEGIN ... {_KEY_MARK.decode()})")
    if any(mark in key_pem for mark in _ENCRYPTED_MARKS):
        raise CLIError(f"--ssl-keyfile: {key_path} is encrypted, and this server (granian) reads no encrypted key: "
                       f"decrypt it (openssl pkey -in {key_path} -out PLAIN.pem) and keep that file yours (chmod 600)")
    if args.ssl_keyfile_password is not None:
        raise CLIError(f"--ssl-keyfile-password: {key_path} is not encrypted; leave the password out")
    try:
        # granian's parent loads them the same way; the callback keeps OpenSSL from prompting on the terminal.
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_path, key_path, password=lambda: b"")
    except ssl.SSLError as exc:
        # OpenSSL's names for a key of another certificate (of its kind, or of another kind: RSA for an EC one)
        mismatch = exc.reason in ("KEY_VALUES_MISMATCH", "NO_CERTIFICATE_ASSIGNED")
        why = "the key is not the certificate's" if mismatch else (exc.reason or str(exc))
        raise CLIError(f"cannot serve HTTPS with --ssl-certfile {cert_path} and --ssl-keyfile {key_path}: "
                       f"{why}") from None
    config.ssl_certfile, config.ssl_keyfile = str(cert_path), str(key_path)


def _read(flag: str, value: str) -> tuple[Path, bytes]:
    """The file's absolute path (the worker may start elsewhere) and its bytes. Raises CLIError naming `flag`: it
    cannot be read, is not a regular file, or is over _MAX_PEM_BYTES."""
    path = Path(value).expanduser().absolute()
    try:
        # Non-blocking: opening a FIFO for reading would wait for a writer; what it is, is asked of the open file.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                what = next((name for test, name in _NOT_FILES if test(mode)), "no regular file")
                raise CLIError(f"{flag}: {path} is {what}, not a PEM file")
            with open(fd, "rb", closefd=False) as file:
                data = file.read(_MAX_PEM_BYTES + 1)
        finally:
            os.close(fd)
    except OSError as exc:
        raise CLIError(f"{flag}: cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > _MAX_PEM_BYTES:
        raise CLIError(f"{flag}: {path} is over {_MAX_PEM_BYTES >> 20} MiB, too big for a PEM certificate chain or key")
    return path, data
