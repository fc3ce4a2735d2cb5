"""A transcription's time while other programs keep the CPU busy (the Whisper step thread's priority, on a CPU).

    python -m bench.speech_beside_load [--clip ../shared/audio/cards-001.wav] [--busy 2] [--nice 19] [--port 8124]

Starts `tandem serve` (embedded default models) with TANDEM_SPEECH_NICE=--nice, then transcribes the clip twice
alone, twice beside `--busy` processes spinning in sessions of their own, once beside them in this script's session,
and times a 40-token chat each time. Chat is idle while it transcribes. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from openai import OpenAI

from bench.serve_procs import Server

SPIN = [sys.executable, "-c", "while True: pass"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clip", default="../shared/audio/cards-001.wav")
    p.add_argument("--busy", type=int, default=2)
    p.add_argument("--nice", default="19")
    p.add_argument("--port", type=int, default=8124)
    a = p.parse_args()
    base = f"http://127.0.0.1:{a.port}"
    log = Path(tempfile.mkdtemp()) / "serve.log"
    server = Server("ours", ["tandem", "serve", "--port", str(a.port)], base, log,
                    env=dict(os.environ, TANDEM_SPEECH_NICE=a.nice))
    server.start()
    out: dict[str, object] = {"nice": a.nice, "busy": a.busy, "ready_s": round(server.wait_ready("/health", 300), 1)}
    client = OpenAI(base_url=f"{base}/v1", api_key="none")
    chat_model = next(m.id for m in client.models.list().data if "whisper" not in m.id.lower())

    def transcribe() -> float:
        t = time.perf_counter()
        with open(a.clip, "rb") as f:
            client.audio.transcriptions.create(model="whisper-1", file=f)
        return round(time.perf_counter() - t, 2)

    def chat() -> float:
        t = time.perf_counter()
        client.chat.completions.create(model=chat_model, messages=[{"role": "user", "content": "Name three rivers."}],
                                       max_tokens=40, temperature=0)
        return round(time.perf_counter() - t, 2)

    def beside(own_sessions: bool, times: int) -> dict[str, object]:
        spinners = [subprocess.Popen(SPIN, start_new_session=own_sessions) for _ in range(a.busy)]
        try:
            return {"transcribe_s": [transcribe() for _ in range(times)], "chat_s": chat()}
        finally:
            for s in spinners:
                s.kill()
                s.wait()

    try:
        out["alone"] = {"transcribe_s": [transcribe(), transcribe()], "chat_s": chat()}
        out["busy_own_sessions"] = beside(True, 2)
        out["busy_same_session"] = beside(False, 1)
    finally:
        server.stop()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
