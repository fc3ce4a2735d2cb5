"""`tandem dictate`: live transcription from a running server over the Realtime protocol — takes from the
microphone (the `mic` extra: sounddevice; Enter starts and stops a take), or `--file` streamed as a microphone
would, in real time (or `--speed` times faster); `-` reads stdin: a container (WAV, ...) read whole as a file is, or
raw 16-bit PCM at `--rate` sent as it arrives (a recorder's pipe). Committed text is printed as it is committed; the
tentative guess after it is shown in place on a terminal."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import queue
import ssl
import sys
import time
from typing import Any, AsyncIterator, BinaryIO, Callable, Iterable

from service.cli.errors import CLIError
from service.cli.parsers import add_command, checked

__all__ = ["add_dictate"]

CHUNK_MS = 100
MIC_RATE = 24000  # what Realtime clients send; the server resamples
STDIN_RATE = 16000  # raw PCM on stdin unless --rate says otherwise
# Bytes of stdin read before deciding container or raw PCM (an MP3 is known by three frame headers in a row).
_SNIFF_BYTES = 4096
# The rates a Realtime session takes for audio/pcm (service/speech/realtime_config.py).
_rate = checked(int, lambda v: 8000 <= v <= 48000, "a sample rate from 8000 to 48000 Hz")


def add_dictate(sub: Any) -> None:
    """Register `tandem dictate`. Raises nothing."""
    p = add_command(sub, "dictate", "live transcription from a running server: the microphone, or a file in real time")
    p.add_argument("legacy_file", nargs="?", default=None, metavar="FILE",
                   help="same as --file; - reads stdin (default: none)")
    p.add_argument("--file", default=None,
                   help="audio file to stream as a microphone would; - reads stdin: a WAV (or another container) read "
                        "whole, or raw 16-bit little-endian mono PCM at --rate, sent as it arrives (default: the "
                        "microphone)")
    p.add_argument("--rate", type=_rate, default=None,
                   help=f"sample rate of raw PCM on stdin (-); a file or WAV says its own (default: {STDIN_RATE})")
    p.add_argument("--server", "--url", dest="server", default="http://127.0.0.1:8080", help="server base URL")
    p.add_argument("--api-key", default=os.environ.get("TANDEM_API_KEY"),
                   help="key the server asks for (default: $TANDEM_API_KEY)")
    p.add_argument("--model", default=None, help="Whisper model id (default: the one the server serves)")
    p.add_argument("--language", default=None, help="ISO-639-1 code or name (default: detected)")
    p.add_argument("--prompt", default=None,
                   help="text to condition the transcription on: style, spelling (default: none)")
    p.add_argument("--vocabulary", nargs="+", default=[], metavar="WORD", help="words to bias the transcription toward")
    p.add_argument("--no-vad", action="store_true",
                   help="no server VAD: an utterance ends only when a take (or the file) ends")
    p.add_argument("--speed", type=float, default=1.0, help="--file: stream this many times faster than real time")
    p.set_defaults(func=_dictate)


def _dictate(args: argparse.Namespace) -> int:
    import anyio

    from service.cli.dictate_client import realtime_url

    path = args.file or args.legacy_file
    if not math.isfinite(args.speed) or args.speed <= 0:  # nan passes `<= 0`; inf made every wait zero
        raise CLIError(f"--speed must be a finite number > 0, not {args.speed}")
    try:
        url = realtime_url(args.server)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if args.model:
        url += f"&model={args.model}"
    if args.rate is not None and path != "-":
        raise CLIError("--rate is the rate of raw PCM on stdin (-): a file, or the microphone, has its own")
    if path == "-":
        return _dictate_stdin(args, url)
    if path is not None:
        from audio.errors import AudioInputError
        from audio.pcm import load_audio_file

        try:
            pcm = load_audio_file(path)
        except (OSError, AudioInputError) as exc:
            raise CLIError(str(exc)) from None
        return _dictate_samples(args, url, pcm)
    _check_no_file_among_words(args.vocabulary)
    sd = _sounddevice()
    return anyio.run(_run, args, url, lambda connect: _takes(connect, sd), MIC_RATE)


def _dictate_samples(args: argparse.Namespace, url: str, pcm: Any) -> int:
    """Stream decoded 16 kHz samples (a file, or a container on stdin) as a microphone would. Raises CLIError."""
    import anyio

    from audio.pcm import SAMPLE_RATE
    from service.cli.dictate_client import pcm16_chunks

    chunks = pcm16_chunks(pcm, SAMPLE_RATE, CHUNK_MS)
    return anyio.run(_run, args, url, lambda connect: _stream(connect, _listed(chunks), SAMPLE_RATE, args.speed),
                     SAMPLE_RATE)


def _dictate_stdin(args: argparse.Namespace, url: str) -> int:
    """`-`: a container on stdin is read whole and decoded, as --file reads a file; anything else is raw 16-bit
    little-endian mono PCM at --rate, sent as it arrives. Raises CLIError (stdin closed, a terminal, empty, a
    container that does not decode, --rate beside a container)."""
    import anyio

    from audio.containers import container_kind

    if sys.stdin is None:  # started with stdin closed (`<&-`): Python leaves sys.stdin None
        raise CLIError("- reads the audio from stdin, which is closed: pipe it in (tandem dictate - < talk.wav)")
    if sys.stdin.isatty():
        raise CLIError("- reads the audio from stdin, which is a terminal: pipe it in (tandem dictate - < talk.wav, "
                       "or a recorder's raw 16-bit PCM with --rate)")
    stream: BinaryIO = sys.stdin.buffer
    head = stream.read(_SNIFF_BYTES)
    if not head:
        raise CLIError("stdin is empty: no audio arrived to dictate")
    if (kind := container_kind(head)) is not None:
        if args.rate is not None:
            raise CLIError(f"--rate is the rate of raw PCM: the {kind} on stdin has its own")
        from audio.errors import AudioInputError
        from audio.pcm import decode_container

        try:
            pcm = decode_container(head + stream.read(), param="stdin")
        except AudioInputError as exc:
            raise CLIError(f"stdin: {exc}") from None
        return _dictate_samples(args, url, pcm)
    rate = args.rate or STDIN_RATE
    chunks = _raw_chunks(stream, head, rate * CHUNK_MS // 1000 * 2)
    return anyio.run(_run, args, url, lambda connect: _stream(connect, chunks, rate, args.speed), rate)


async def _listed(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def _raw_chunks(stream: BinaryIO, head: bytes, size: int) -> AsyncIterator[bytes]:
    """Whole 16-bit samples from `stream` (after `head`, already read), in chunks of up to `size` bytes, each as it
    arrives (a reader thread waits for the pipe). A last odd byte, half a sample, is dropped with a note."""
    import anyio

    pending = head
    while True:
        data = await anyio.to_thread.run_sync(stream.read, size)
        pending += data
        while len(pending) >= size or (not data and len(pending) > 1):
            cut = min(size, len(pending) - len(pending) % 2)
            yield pending[:cut]
            pending = pending[cut:]
        if not data:
            if pending:
                print("tandem: stdin ended mid-sample: its last byte (half a 16-bit sample) was not sent",
                      file=sys.stderr)
            return


def _check_no_file_among_words(vocabulary: list[str]) -> None:
    """Raise CLIError when no file was given but the last --vocabulary word is one: `--vocabulary A B FILE` reads
    FILE as a word (nargs="+" takes it), and the microphone was tried instead of the file."""
    if vocabulary and os.path.isfile(last := vocabulary[-1]):
        raise CLIError(f"{last} was read as a vocabulary word: put it before --vocabulary or pass --file {last}")


def _sounddevice() -> Any:
    try:
        import sounddevice
    except ImportError:
        raise CLIError("no microphone support: install the mic extra (pip install 'mlx-tandem[mic]'; in a clone, "
                       "`uv sync` with the extras you use plus `--extra mic`, e.g. uv sync --extra cpu --extra demo "
                       "--extra mic), or pass --file") from None
    except OSError as exc:  # sounddevice is there, PortAudio is not
        raise CLIError(f"no microphone support ({exc}): install PortAudio (e.g. apt install libportaudio2), "
                       "or pass --file") from None
    return sounddevice


Connect = Callable[[], contextlib.AbstractAsyncContextManager[Any]]  # a configured DictateSession, its socket open


async def _run(args: argparse.Namespace, url: str, feed: Callable[[Connect], Any], rate: int) -> int:
    from service.cli.dictate_client import LiveLine

    display = LiveLine(sys.stdout)
    await feed(lambda: _connected(args, url, rate, display))
    return 0


@contextlib.asynccontextmanager
async def _connected(args: argparse.Namespace, url: str, rate: int, display: Any) -> AsyncIterator[Any]:
    """A Realtime session on a new websocket, configured, its events handled until the block ends; then the
    socket is closed. Raises CLIError (unreachable, refused, ended by the server), as one line."""
    import anyio
    import websockets

    from service.cli.dictate_client import DictateSession

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        ws = await websockets.connect(url, additional_headers=headers, max_size=None)
    except websockets.InvalidStatus as exc:
        raise _refused(args, url, headers, exc.response.status_code) from None
    except ssl.SSLCertVerificationError as exc:
        raise CLIError(f"cannot reach {args.server}: {exc.verify_message or exc}: trust its certificate (or its CA) "
                       "with SSL_CERT_FILE=PEM", code=1) from None
    except (OSError, websockets.InvalidHandshake, websockets.InvalidURI) as exc:
        raise CLIError(f"cannot reach {args.server}: {exc}", code=1) from None
    session = DictateSession(ws, display)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_receive_until_closed, session, ws)
            try:
                with anyio.fail_after(60):  # the server answers at once; only a wedged one takes longer
                    await session.configure(rate=rate, language=args.language, prompt=args.prompt,
                                            keywords=list(args.vocabulary), vad=not args.no_vad)
            except RuntimeError as exc:
                raise CLIError(f"the server refused the session: {exc}", code=1) from None
            except TimeoutError:
                raise CLIError("the server did not answer the session settings", code=1) from None
            yield session
            tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:  # a task of the group failed: report its first cause as one line
        raise _one_error(group, session) from None
    except websockets.ConnectionClosed as exc:
        raise _closed(exc, session) from None
    finally:
        await ws.close()


async def _receive_until_closed(session: Any, ws: Any) -> None:
    """The session's events until the connection ends; an end the client did not ask for (the server's
    close, even a normal one) is an error: nothing else would wake a take waiting for its transcripts."""
    await session.receive(ws)
    raise _closed(ws.close_exc, session)


def _refused(args: argparse.Namespace, url: str, headers: dict[str, str], status: int) -> CLIError:
    """The handshake was answered with an HTTP error, which says no more than 403 whatever the cause (a
    missing or wrong API key, a server still starting, a browser Origin it does not allow): an HTTP request
    with the same key tells them apart."""
    import httpx

    base = url.split("/realtime?", 1)[0].replace("ws://", "http://", 1).replace("wss://", "https://", 1)
    try:
        # The websocket's trust (the system's CAs, SSL_CERT_FILE), not httpx's own certifi bundle.
        response = httpx.get(f"{base}/models", headers=headers, timeout=5, verify=ssl.create_default_context())
        answer, message = response.status_code, str(response.json().get("error", {}).get("message") or "")
    except (httpx.HTTPError, ValueError, AttributeError):
        answer, message = 0, ""
    if answer == 401:
        if not args.api_key:
            return CLIError(f"the server {args.server} needs an API key (HTTP {status}): pass --api-key or set "
                            "TANDEM_API_KEY", code=1)
        return CLIError(f"the server {args.server} refused the API key (HTTP {status}): check --api-key / "
                        "TANDEM_API_KEY", code=1)
    if answer == 503:
        return CLIError(f"the server {args.server} is not ready: {message or 'retry shortly'}", code=1)
    return CLIError(f"the server {args.server} refused the connection (HTTP {status})", code=1)


def _closed(exc: Any, session: Any) -> CLIError:
    """The server closed the websocket before the run ended: its last error event, else the close frame."""
    if session.errors:
        return CLIError(f"the server ended the session: {session.errors[-1].get('message')}", code=1)
    if exc is None or exc.rcvd is None:
        return CLIError("the server dropped the connection (no close frame)", code=1)
    reason = exc.rcvd.reason
    return CLIError(f"the server closed the connection (code {exc.rcvd.code}{': ' + reason if reason else ''})",
                    code=1)


def _one_error(group: BaseExceptionGroup[Any], session: Any) -> BaseException:
    """The exception to report for a failed task group: a CLIError in it, else a closed connection as a
    CLIError; anything else unchanged (a real bug keeps its traceback)."""
    import websockets

    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    for exc in leaves:
        if isinstance(exc, (CLIError, KeyboardInterrupt)):
            return exc
    for exc in leaves:
        if isinstance(exc, websockets.ConnectionClosed):
            return _closed(exc, session)
    return group


async def _stream(connect: Connect, chunks: AsyncIterator[bytes], rate: int, speed: float) -> None:
    """Send 16-bit `chunks` at `rate`, no faster than real time × `speed` (as a microphone delivers them), end the
    take, and summarise on stderr. Raises CLIError (the session's failures)."""
    import anyio

    async with connect() as session:
        start = time.perf_counter()
        sent = 0
        async for chunk in chunks:
            await session.append(chunk)
            sent += len(chunk) // 2
            # a microphone delivers audio no faster than it is spoken (× speed)
            await anyio.sleep(max(0.0, start + sent / rate / speed - time.perf_counter()))
        end = time.perf_counter()
        await session.finish_take()
    first = ("" if session.first_text_at is None
             else f"first text {session.first_text_at - start:.2f} s after the start; ")
    print(f"\n{sent / rate:.1f} s of audio; {first}done {time.perf_counter() - end:.2f} s after the last chunk; "
          f"{session.spoken} utterance{'' if session.spoken == 1 else 's'}", file=sys.stderr)


async def _takes(connect: Connect, sd: Any) -> None:
    """Enter starts a take, Enter ends it; end of input (Ctrl-D) quits. Each take is a session of its own: a
    socket left silent between takes holds one of the server's places and is closed after its --session-ttl."""
    import anyio

    chunks: queue.Queue[bytes] = queue.Queue()

    def captured(data: Any, frames: int, when: Any, status: Any) -> None:
        chunks.put(bytes(data))  # PortAudio's thread: hand the bytes over, nothing else

    async with connect():  # the server, the key and the settings are checked before the first take
        pass
    while True:
        print("Enter starts a take (Ctrl-D quits) ", end="", file=sys.stderr, flush=True)
        if not await anyio.to_thread.run_sync(sys.stdin.readline):
            return
        stop = anyio.Event()

        async def until_enter() -> None:
            await anyio.to_thread.run_sync(sys.stdin.readline)
            stop.set()

        async with connect() as session:
            print("recording — Enter ends the take", file=sys.stderr, flush=True)
            async with anyio.create_task_group() as tg:
                tg.start_soon(until_enter)
                with sd.RawInputStream(samplerate=MIC_RATE, channels=1, dtype="int16",
                                       blocksize=MIC_RATE * CHUNK_MS // 1000, callback=captured):
                    while not stop.is_set():
                        await _drain(chunks, session)
                        await anyio.sleep(CHUNK_MS / 2000)  # poll the capture queue at twice the chunk rate
                await _drain(chunks, session)
            await session.finish_take()


async def _drain(chunks: "queue.Queue[bytes]", session: Any) -> None:
    while True:
        try:
            chunk = chunks.get_nowait()
        except queue.Empty:
            return
        await session.append(chunk)
