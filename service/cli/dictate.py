"""`tandem dictate FILE`: stream a file to a running server's live session like a microphone would."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from service.cli.errors import CLIError
from service.cli.parsers import add_command

__all__ = ["add_dictate"]


def add_dictate(sub: Any) -> None:
    """Register `tandem dictate`. Raises nothing."""
    p = add_command(sub, "dictate", "stream an audio file to a running server's live session in chunks")
    p.add_argument("file", help="audio file to send as a microphone would")
    p.add_argument("--url", default="http://127.0.0.1:8080", help="server base URL")
    p.add_argument("--model", default=None, help="Whisper model id (default: the one the server serves)")
    p.add_argument("--language", default=None, help="ISO-639-1 code or name (default: detected)")
    p.add_argument("--chunk-ms", type=int, default=250, help="milliseconds of audio per request")
    p.add_argument("--realtime", action="store_true", help="pace chunks at speaking speed")
    p.add_argument("--s16", action="store_true", help="send 16-bit PCM instead of float32")
    p.set_defaults(func=_dictate)


def _dictate(args: argparse.Namespace) -> int:
    import httpx
    import numpy as np

    from audio.errors import AudioInputError
    from audio.pcm import SAMPLE_RATE, load_audio_file

    try:
        pcm = load_audio_file(args.file)
    except (FileNotFoundError, AudioInputError) as exc:
        raise CLIError(str(exc)) from None
    if args.chunk_ms < 10:
        raise CLIError("--chunk-ms must be >= 10")
    base = args.url.rstrip("/")
    step = SAMPLE_RATE * args.chunk_ms // 1000
    if args.s16:
        ctype, payload = f"audio/pcm;rate={SAMPLE_RATE};encoding=s16le", (np.clip(pcm, -1, 1) * 32767).astype("<i2")
    else:
        ctype, payload = f"audio/pcm;rate={SAMPLE_RATE}", pcm.astype("<f4")
    try:
        with httpx.Client(timeout=600) as http:
            r = http.post(f"{base}/v1/audio/sessions", json={k: v for k, v in
                                                            (("model", args.model), ("language", args.language)) if v})
            _raise_for(r)
            sid = r.json()["id"]
            start = time.perf_counter()
            for i in range(0, len(payload), step):
                r = http.post(f"{base}/v1/audio/sessions/{sid}/audio", content=payload[i:i + step].tobytes(),
                              headers={"content-type": ctype})
                _raise_for(r)
                if args.realtime:  # a microphone delivers audio no faster than it is spoken
                    time.sleep(max(0.0, start + (i + step) / SAMPLE_RATE - time.perf_counter()))
            t0 = time.perf_counter()
            r = http.post(f"{base}/v1/audio/sessions/{sid}/finish")
            _raise_for(r)
            latency = time.perf_counter() - t0
            http.delete(f"{base}/v1/audio/sessions/{sid}")
    except httpx.HTTPError as exc:
        raise CLIError(f"cannot reach {base}: {exc}", code=1) from None
    print(r.json()["text"].strip())
    print(f"{len(pcm) / SAMPLE_RATE:.1f} s audio, {r.json().get('duration', 0):.1f} s decoded; finish took {latency:.2f} s",
          file=sys.stderr)
    return 0


def _raise_for(r: Any) -> None:
    if r.status_code >= 400:
        try:
            message = r.json()["error"]["message"]
        except Exception:
            message = r.text[:200]
        raise CLIError(f"server said {r.status_code}: {message}", code=1)
