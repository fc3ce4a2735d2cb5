"""`tandem serve --ssl-certfile --ssl-keyfile`: one real server with a certificate made here (trustme), serving HTTPS
and WSS on its port — a chat request and a Realtime session as openai-node's Node client opens it, `tandem dictate`
trusting the CA through SSL_CERT_FILE, and plain HTTP refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import wave
from pathlib import Path
from typing import Iterator

import anyio
import httpx
import openai
import pytest
import websockets

from tests.e2e.conftest import TandemServer, start_tandem_server
from tests.e2e.test_realtime_sdk import LIMIT, b64, voiced
from tests.fixtures.tiny_whisper import build_tiny_whisper

trustme = pytest.importorskip("trustme")  # the test extra's; a bare install skips these


@pytest.fixture(scope="module")
def tls_server(tiny_llm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TandemServer]:
    """The tiny chat model and a tiny Whisper over HTTPS, with a certificate for 127.0.0.1 from a CA made here."""
    folder = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    issued.private_key_pem.write_to_path(str(folder / "key.pem"))
    for i, blob in enumerate(issued.cert_chain_pems):  # the server's certificate, then the chain to the CA
        blob.write_to_path(str(folder / "cert.pem"), append=i > 0)
    whisper = build_tiny_whisper(tmp_path_factory.mktemp("tiny_whisper"))
    server = start_tandem_server(str(tiny_llm_dir), "--whisper-model", str(whisper), "--whisper-resident",
                                 "--ssl-certfile", str(folder / "cert.pem"), "--ssl-keyfile", str(folder / "key.pem"),
                                 ca=folder / "ca.pem")
    try:
        yield server
    finally:
        server.stop()


def test_chat_is_served_over_https_and_plain_http_is_not(tls_server: TandemServer) -> None:
    assert tls_server.wait_for_line(f"starting on https://127.0.0.1:{tls_server.port}/v1"), tls_server.output()
    client = openai.OpenAI(base_url=tls_server.base_url, api_key="unused", max_retries=0, timeout=120,
                           http_client=httpx.Client(verify=tls_server.verify))
    model = next(card.id for card in client.models.list().data if "whisper" not in card.id)
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert reply.choices[0].message.content and reply.usage is not None and reply.usage.completion_tokens > 0
    with pytest.raises(httpx.TransportError):  # the TLS listener reads no HTTP request line
        httpx.get(f"http://127.0.0.1:{tls_server.port}/health", timeout=10)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):  # only a client trusting the CA
        httpx.get(f"{tls_server.root}/health", timeout=10, verify=True)


@pytest.mark.anyio
async def test_a_realtime_session_over_wss_as_node_opens_it(tls_server: TandemServer) -> None:
    # openai-node's OpenAIRealtimeWS: wss://, `?model=` and no `intent` (it cannot add one); a transcription model
    # name makes it a transcription session.
    url = f"wss://127.0.0.1:{tls_server.port}/v1/realtime?model=gpt-4o-transcribe"
    with anyio.fail_after(LIMIT):
        async with websockets.connect(url, ssl=tls_server.verify, ping_interval=None) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(voiced(1.0))}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            done = "conversation.item.input_audio_transcription.completed"
            while (event := json.loads(await ws.recv()))["type"] != done:
                assert event["type"] != "error", event


def test_dictate_reaches_an_https_server_whose_ca_it_is_given(tls_server: TandemServer, tmp_path: Path) -> None:
    wav = tmp_path / "take.wav"
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes((voiced(1.0, 16000) * 32767).astype("<i2").tobytes())
    command = [sys.executable, "-m", "service.cli", "dictate", "--file", str(wav), "--server", tls_server.root,
               "--speed", "8"]
    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    untrusted = subprocess.run(command, capture_output=True, text=True, timeout=LIMIT, env=env)
    assert untrusted.returncode == 1 and "SSL_CERT_FILE" in untrusted.stderr, untrusted.stderr
    assert untrusted.stderr.strip().count("\n") == 0, untrusted.stderr  # one line, no traceback
    trusted = subprocess.run(command, capture_output=True, text=True, timeout=LIMIT,
                             env={**env, "SSL_CERT_FILE": str(tls_server.ca)})
    assert trusted.returncode == 0 and "1.0 s of audio" in trusted.stderr, trusted.stderr
