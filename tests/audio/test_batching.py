"""audio/batching.py: chunks cut at silences, several chunks decoded side by side."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from audio.batching import plan_chunks
from audio.decoding import N_SAMPLES
from audio.scheduler import StepBudget
from audio.speech import SpeechService
from audio.whisper import LoadedWhisper
from tests.audio.conftest import SR, running_tasks, voiced
from tests.fixtures.scripted_scheduler import ScriptedScheduler

EOT = 50257  # the English-only tokenizer's end of text: the tokens below it are text


def test_chunks_are_cut_in_silence_and_never_exceed_a_window() -> None:
    silence = np.zeros(3 * SR, np.float32)
    pcm = np.concatenate([voiced(10), silence, voiced(10), silence, voiced(12), silence, voiced(40)])
    chunks = plan_chunks(pcm)
    assert all(0 < b - a <= N_SAMPLES for a, b in chunks)
    assert chunks[0][0] <= 0.1 * SR and chunks[-1][1] >= len(pcm) - 0.3 * SR
    speech_ends = [10, 23, 38]  # seconds where speech stops before a silence
    cuts = [b / SR for _, b in chunks[:-1]]
    assert all(any(abs(c - e) < 0.5 for e in speech_ends) or c - chunks[0][0] / SR >= 29 for c in cuts), cuts


def test_no_speech_means_fixed_windows() -> None:
    assert plan_chunks(np.zeros(65 * SR, np.float32)) == [(0, N_SAMPLES), (N_SAMPLES, 2 * N_SAMPLES),
                                                           (2 * N_SAMPLES, 65 * SR)]


@pytest.mark.anyio
async def test_a_batch_of_chunks_decodes_side_by_side(tiny_whisper_dir: Path) -> None:
    silence = np.zeros(2 * SR, np.float32)
    pcm = np.concatenate([voiced(20), silence, voiced(20), silence, voiced(20)])
    async with running_tasks() as tasks:
        speech = SpeechService(tasks, tiny_whisper_dir, dtype="float32", resident=True,
                               budget=StepBudget(encoder_positions=24000))
        await speech.residency.preload()
        t = await speech.transcribe(pcm, speech.options(temperatures=(0.0,), batch_size=8, without_timestamps=True))
        counters = speech.scheduler.counters
        assert counters.windows == 3 and counters.max_rows == 3  # three chunks' rows in each decoder step
        assert counters.encoder_steps == 2  # 3 windows × 10 units (chunks of 1500 positions); 16 fit a step
        assert t.duration == pytest.approx(len(pcm) / SR)
        assert all(0 <= s.start <= s.end <= len(pcm) / SR + 0.01 for s in t.segments)
        assert [s.id for s in t.segments] == list(range(len(t.segments)))


@pytest.mark.anyio
async def test_a_chunk_decoded_short_of_its_end_goes_on_from_its_last_segment(tiny_whisper: LoadedWhisper) -> None:
    # a 25.6 s chunk whose decode stopped at 22.78 s lost "He was not an ill-disposed young man." (probe, batch 2)
    from audio.batching import batched_windows
    from audio.decoding import WindowedTranscription
    from audio.transcript import TranscribeOptions

    tr = await WindowedTranscription.start(tiny_whisper, TranscribeOptions(temperatures=(0.0,), batch_size=2))
    tok, ts = tr.tokenizer, tr.tokenizer.timestamp_begin
    pcm = voiced(25)
    first = [ts, *tok.encode(" And Mr. John Dashwood"), ts + 250, ts + 250, *tok.encode(" his power."), ts + 500,
             ts + 500, *tok.encode(" He was not")]  # ends inside its third segment: that one is redone
    second = [ts, *tok.encode(" He was not an ill-disposed young man."), ts + 300]
    scheduler = ScriptedScheduler(first, second, [ts, ts + 100])
    segments = [s async for new in batched_windows(tr, pcm, 2, scheduler, None) for s in new]  # type: ignore[arg-type]
    frames = [r.frames for r in scheduler.requests]
    assert len(frames) == 2 and frames[1] == frames[0] - 1000  # the second window starts at the last timestamp, 10 s
    assert [s.text for s in segments] == [" And Mr. John Dashwood", " his power.", " He was not an ill-disposed young man."]
    assert segments[2].start == pytest.approx(10.0 + segments[0].start, abs=0.25) and segments[2].seek == 1000 + segments[0].seek
    assert tr.text().endswith("his power. He was not an ill-disposed young man.")
    assert not scheduler.requests[0].prompt  # the chunk's second window is conditioned on its first's text
    assert tok.decode(list(scheduler.requests[1].prompt)) == " And Mr. John Dashwood his power."


@pytest.mark.anyio
async def test_batched_chunks_keep_their_tokens_log_probabilities_when_asked(tiny_whisper_dir: Path) -> None:
    silence = np.zeros(2 * SR, np.float32)
    pcm = np.concatenate([voiced(5), silence, voiced(5)])
    async with running_tasks() as tasks:
        speech = SpeechService(tasks, tiny_whisper_dir, dtype="float32", resident=True)
        await speech.residency.preload()
        for asked in (True, False):
            t = await speech.transcribe(pcm, speech.options(temperatures=(0.0,), batch_size=2, without_timestamps=True,
                                                            logprobs=asked))
            assert t.segments
            if not asked:
                assert t.logprobs is None and all(s.logprobs is None for s in t.segments)
                continue
            for s in t.segments:
                assert s.logprobs is not None and len(s.logprobs) == len([x for x in s.tokens if x < EOT])
                assert bytes(b for e in s.logprobs for b in e.bytes).decode() == s.text
            assert t.logprobs is not None and bytes(b for e in t.logprobs for b in e.bytes).decode() == t.text
            assert all(e.logprob <= 0 for e in t.logprobs)
