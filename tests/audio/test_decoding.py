"""audio/decoding.py: the seek loop over the scheduler, on a tiny random-init Whisper — planning, seeking,
clamped segment times, word timestamps, the prompt."""

from __future__ import annotations

import numpy as np
import pytest

from audio.decoding import N_FRAMES, N_SAMPLES, WindowedTranscription
from audio.scheduler import WhisperScheduler
from audio.timeline import compact
from audio.token_logprobs import FLOOR
from audio.transcript import TranscribeOptions
from audio.whisper import LoadedWhisper
from tests.audio.conftest import running_tasks
from tests.fixtures.scripted_scheduler import ScriptedScheduler

FAST = TranscribeOptions(temperatures=(0.0,), without_timestamps=True)
pytestmark = pytest.mark.anyio


def noise(seconds: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.1, int(seconds * 16000)).astype(np.float32)


async def transcribe(loaded: LoadedWhisper, pcm: np.ndarray, options: TranscribeOptions,
                     **kw: object) -> tuple[WindowedTranscription, list[tuple[int, int]]]:
    windows = []
    async with running_tasks() as tasks:
        tr = await WindowedTranscription.start(loaded, options, **kw)  # type: ignore[arg-type]
        scheduler = WhisperScheduler(tasks)
        while (w := tr.next_window(len(pcm), final=True)) is not None:
            windows.append(w)
            await tr.step(pcm[w[0]: w[0] + N_SAMPLES], w[1], scheduler, tasks)
    return tr, windows


async def test_planning_full_windows_before_final(tiny_whisper: LoadedWhisper) -> None:
    tr = await WindowedTranscription.start(tiny_whisper, FAST)
    assert tr.next_window(N_SAMPLES - 1, final=False) is None
    assert tr.next_window(N_SAMPLES, final=False) == (0, N_FRAMES)
    assert tr.next_window(16000 * 10, final=True) == (0, 1000)
    tr.skip(N_FRAMES)
    assert tr.next_window(N_SAMPLES + 16000, final=True) == (N_SAMPLES, 100)
    assert tr.next_window(N_SAMPLES, final=True) is None


async def test_without_timestamps_each_window_advances_by_its_length(tiny_whisper: LoadedWhisper) -> None:
    tr, windows = await transcribe(tiny_whisper, noise(65), FAST)
    assert windows == [(0, 3000), (480000, 3000), (960000, 500)]
    t = tr.transcript(65.0)
    assert t.language == "en" and t.duration == 65.0 and t.task == "transcribe"
    assert all(0 <= s.start <= s.end <= 65.0 for s in t.segments)


async def test_timestamped_decoding_never_stalls_and_times_stay_inside_the_audio(tiny_whisper: LoadedWhisper) -> None:
    pcm = noise(6, seed=1)
    tr, windows = await transcribe(tiny_whisper, pcm, TranscribeOptions(temperatures=(0.0,)))
    starts = [w[0] for w in windows]
    assert starts == sorted(set(starts)) and tr.seek >= 600
    t = tr.transcript(6.0)
    # the random model emits timestamps up to 30 s: every one is clamped to its window's audio
    assert all(0 <= s.start <= s.end <= 6.0 for s in t.segments)
    for s in tr.segments:
        window_start = s["seek"] / 100
        assert window_start <= s["start"] <= s["end"] <= 6.0


async def test_split_clamps_to_the_window(tiny_whisper: LoadedWhisper) -> None:
    tr = await WindowedTranscription.start(tiny_whisper, FAST)
    ts = tr.tokenizer.timestamp_begin
    from audio.decoder import RowResult
    from audio.window import WindowResult

    result = WindowResult(RowResult([], [], "", -0.1, 0.0, 0.0, 1.0), "en")
    tokens = [ts, 1000, 1001, ts + 100, ts + 100, 1002, ts + 1500]  # 0.0–2.0 s, then 2.0–30.0 s
    segments, advance, single = tr.split(tokens, result, 10.0, 109)  # a 1.09 s window at 10 s
    assert single and advance == 109
    assert [(s["start"], s["end"]) for s in segments] == [(10.0, 11.09), (11.09, 11.09)]


async def test_times_map_through_a_timeline(tiny_whisper: LoadedWhisper) -> None:
    pcm = noise(20, seed=4)
    compacted, timeline = compact(pcm, [(0, 3 * 16000), (15 * 16000, 17 * 16000)])
    tr, _ = await transcribe(tiny_whisper, compacted, TranscribeOptions(temperatures=(0.0,)), timeline=timeline)
    t = tr.transcript(20.0)
    for s in t.segments:
        assert 0 <= s.start <= s.end <= 17.0
        assert not 3.0 < s.start < 15.0  # nothing starts inside the cut-out silence


async def test_prompt_tokens_prefix_but_do_not_appear_in_text(tiny_whisper: LoadedWhisper) -> None:
    options = TranscribeOptions(temperatures=(0.0,), without_timestamps=True, prompt="Kenobi")
    tr = await WindowedTranscription.start(tiny_whisper, options)
    assert tr.all_tokens == tr.initial_prompt_tokens and tr.initial_prompt_tokens
    assert "Kenobi" not in tr.text()
    request = tr.request(noise(1), 100)
    assert list(request.prompt) == tr.initial_prompt_tokens
    # a forced prefix takes the prompt's room first: prompt + prefix stay within n_ctx / 2 - 1
    long_prefix = list(range(1000, 1000 + 30))
    assert len(tr.request(noise(1), 100, prefix=long_prefix).prompt) == 64 // 2 - 1 - 30


async def test_a_prompt_naming_a_special_token_is_plain_text(tiny_whisper: LoadedWhisper) -> None:
    # tiktoken refused "<|endoftext|>" in the text (a 500 for the request); it is those characters, never the token
    options = TranscribeOptions(temperatures=(0.0,), prompt="see <|endoftext|> and <|0.00|>")
    tr = await WindowedTranscription.start(tiny_whisper, options)
    assert tr.initial_prompt_tokens and all(t < tr.tokenizer.eot for t in tr.initial_prompt_tokens)
    assert tr.tokenizer.decode(tr.initial_prompt_tokens) == " see <|endoftext|> and <|0.00|>"


async def test_word_timestamps_attach_words(tiny_whisper: LoadedWhisper) -> None:
    options = TranscribeOptions(temperatures=(0.0,), word_timestamps=True)
    async with running_tasks() as tasks:
        tr = await WindowedTranscription.start(tiny_whisper, options)
        # one window is enough: the random model's words seek in tiny steps
        new = await tr.step(noise(4, seed=2), 400, WhisperScheduler(tasks), tasks)
    words = [w for s in new for w in s.words]
    assert words and all(0 <= w.start <= w.end <= 4.0 for w in words) and tr.seek > 0


async def test_a_window_that_writes_its_conditioning_again_is_decoded_without_it(tiny_whisper: LoadedWhisper) -> None:
    # over speech with its pauses cut out a window read the previous sentences back for 37 s (WER 0.446 → 0.146)
    tr = await WindowedTranscription.start(tiny_whisper, TranscribeOptions(temperatures=(0.0,)))
    tok, ts = tr.tokenizer, tr.tokenizer.timestamp_begin
    said = tok.encode(" He was not an ill disposed young man. Unless to be rather cold hearted")
    tr.all_tokens += [ts, *said, ts + 100]
    copy = [ts, *tok.encode(" rather cold hearted. He was not an ill disposed young man. Unless to be"), ts + 400]
    heard = [ts, *tok.encode(" Ten of clubs."), ts + 100]
    scheduler = ScriptedScheduler(copy, heard)
    await tr.step(noise(10), 1000, scheduler, None)  # type: ignore[arg-type]
    first, second = scheduler.requests
    assert first.prompt and not second.prompt
    assert tr.text().endswith(" Ten of clubs.")
    # a client's own prompt said in the audio is no copy
    tr = await WindowedTranscription.start(tiny_whisper, TranscribeOptions(
        temperatures=(0.0,), prompt="He was not an ill disposed young man. Unless to be rather cold hearted"))
    scheduler = ScriptedScheduler(copy)
    await tr.step(noise(10), 1000, scheduler, None)  # type: ignore[arg-type]
    assert len(scheduler.requests) == 1


async def test_word_timestamps_never_seek_past_the_windows_last_timestamp(tiny_whisper: LoadedWhisper) -> None:
    # With VAD the probe's file lost "rather": its window ended on "... cold-hearted and<|24.88|><|24.88|>", the aligned
    # "and" ended at 25.10, and the next window began after "rather". Before the last timestamp Whisper's seek stays.
    options = TranscribeOptions(temperatures=(0.0,), word_timestamps=True)
    for word_end, seek in ((10.22, 1000), (9.8, 980)):
        tr = await WindowedTranscription.start(tiny_whisper, options)
        tok, ts = tr.tokenizer, tr.tokenizer.timestamp_begin
        tokens = [ts, *tok.encode(" cold-hearted"), ts + 250, ts + 250, *tok.encode(" and"), ts + 500, ts + 500]

        async def align(current: list[dict], result: object, frames: int, tasks: object, end: float = word_end) -> None:
            for s in current:
                s["words"] = [{"word": s["text"], "start": s["start"], "end": s["end"], "probability": 0.9}]
            current[-1]["words"][-1]["end"] = end

        tr.align = align  # type: ignore[method-assign]
        await tr.step(noise(20), 2000, ScriptedScheduler(tokens), None)  # type: ignore[arg-type]
        assert tr.seek == seek, (word_end, tr.seek)


async def test_word_and_segment_times_never_go_back_at_a_window_seam(tiny_whisper: LoadedWhisper) -> None:
    # The probe's 5-min file: a window's last timestamp at 77.34 s, its last word "was" aligned to end at 77.54; the
    # seek stopped at the timestamp and the next window's "not" began at 77.34: words and segments went back 0.2 s.
    options = TranscribeOptions(temperatures=(0.0,), word_timestamps=True)
    tr = await WindowedTranscription.start(tiny_whisper, options)
    tok, ts = tr.tokenizer, tr.tokenizer.timestamp_begin
    first = [ts, *tok.encode(" cold-hearted"), ts + 250, ts + 250, *tok.encode(" and"), ts + 500, ts + 500]
    second = [ts, *tok.encode(" rather"), ts + 100, ts + 100, *tok.encode(" selfish."), ts + 500]
    windows = iter([10.22, None])

    async def align(current: list[dict], result: object, frames: int, tasks: object) -> None:
        for s in current:
            s["words"] = [{"word": s["text"], "start": s["start"], "end": s["end"], "probability": 0.9}]
        if (end := next(windows)) is not None:  # the last word aligned past the window's last timestamp
            current[-1]["words"][-1]["end"] = current[-1]["end"] = end

    tr.align = align  # type: ignore[method-assign]
    scheduler, pcm = ScriptedScheduler(first, second), noise(20)
    while (w := tr.next_window(len(pcm), final=True)) is not None:
        await tr.step(pcm[w[0]: w[0] + N_SAMPLES], w[1], scheduler, None)  # type: ignore[arg-type]
    segments = tr.transcript(20.0).segments
    assert [s.text for s in segments] == [" cold-hearted", " and", " rather", " selfish."]
    words = [w for s in segments for w in s.words]
    assert all(a.end <= b.start for a, b in zip(words, words[1:])), [(w.start, w.end) for w in words]
    assert all(a.end <= b.start for a, b in zip(segments, segments[1:])), [(s.start, s.end) for s in segments]
    assert (segments[1].end, segments[2].start) == (10.0, 10.0)  # "and" ends where the next window begins


async def test_sampled_windows_draw_anew_each_transcription_and_greedy_ones_stay_exact(
        tiny_whisper: LoadedWhisper) -> None:
    # Every request keyed its draws with seed 0: temperature 1 gave the same text on every call.
    pcm = noise(3, seed=2)
    hot = TranscribeOptions(temperatures=(1.0,), without_timestamps=True)
    sampled = [(await transcribe(tiny_whisper, pcm, hot))[0].all_tokens for _ in range(3)]
    assert len({tuple(t) for t in sampled}) > 1
    seeded = [(await transcribe(tiny_whisper, pcm, hot, seed=7))[0].all_tokens for _ in range(2)]
    assert seeded[0] == seeded[1]  # a given seed draws the same (the draws are keyed, not the global RNG's)
    greedy = [(await transcribe(tiny_whisper, pcm, FAST))[0].all_tokens for _ in range(2)]
    assert greedy[0] == greedy[1]


async def test_a_window_ends_where_speech_resumes_after_a_long_removed_silence(tiny_whisper: LoadedWhisper) -> None:
    # With VAD, one window read the speech on both sides of 45 s of removed silence as one segment: its SRT cue
    # stayed on screen through the silence. Windows now end at such a gap, as Whisper's clip_timestamps do.
    second = 16000
    pcm = np.zeros(60 * second, np.float32)
    speech, timeline = compact(pcm, [(0, 5 * second), (6 * second, 10 * second), (50 * second, 60 * second)])
    tr = await WindowedTranscription.start(tiny_whisper, FAST, timeline=timeline)
    assert tr.next_window(len(speech), final=True) == (0, 1900)  # one 19 s window: no gap counted
    tr.break_gap = 2.0
    assert tr.next_window(len(speech), final=True) == (0, 900)  # the 1 s gap is kept, the 40 s one ends it
    tr.skip(900)
    assert tr.next_window(len(speech), final=True) == (9 * second, 1000)


async def tail_window(loaded: LoadedWhisper, last_word_end: float,
                      tail_words: list[tuple[str, float, float, float]]) -> WindowedTranscription:
    """A 29.5 s signal: a first window writing "... Seven of Hearts." up to its last timestamp at 29.0 s (its last
    aligned word ending at `last_word_end`), then a window from the seek to the signal's end that writes
    " Seven of Clothes.", aligned as `tail_words`."""
    options = TranscribeOptions(temperatures=(0.0,), word_timestamps=True)
    tr = await WindowedTranscription.start(loaded, options)
    tok, ts = tr.tokenizer, tr.tokenizer.timestamp_begin
    first = [ts, *tok.encode(" Four of Clubs."), ts + 1400, ts + 1400, *tok.encode(" Seven of Hearts."), ts + 1450,
             ts + 1450]
    scheduler = ScriptedScheduler(first, [ts, *tok.encode(" Seven of Clothes."), ts + 50])
    windows = iter([None, tail_words])

    async def align(current: list[dict], result: object, frames: int, tasks: object) -> None:
        tail = next(windows)
        for s in current:
            if tail is None:  # the said words: evenly over their segment
                said = s["text"].split()
                step = (s["end"] - s["start"]) / len(said)
                s["words"] = [{"word": " " + w, "start": s["start"] + k * step, "end": s["start"] + (k + 1) * step,
                               "probability": 0.9} for k, w in enumerate(said)]
            else:
                s["words"] = [{"word": w, "start": a, "end": b, "probability": p} for w, a, b, p in tail]
        if tail is None:
            current[-1]["words"][-1]["end"] = last_word_end

    tr.align = align  # type: ignore[method-assign]
    pcm = noise(29.5)
    while (w := tr.next_window(len(pcm), final=True)) is not None:
        await tr.step(pcm[w[0]: w[0] + N_SAMPLES], w[1], scheduler, None)  # type: ignore[arg-type]
    return tr


async def test_word_timestamps_drop_the_invented_tail_of_a_window_from_inside_the_last_words(
        tiny_whisper: LoadedWhisper) -> None:
    # The probe's file with word timestamps ended "... Seven of Hearts. Seven of Clothes.": the seek went to the aligned
    # end of "Hearts." (before the last timestamp), and the 0.6 s left were read as more text, its words of no length.
    invented = [(" Seven", 28.8, 29.5, 0.0), (" of", 29.5, 29.5, 0.02), (" Clothes.", 29.5, 29.5, 0.01)]
    tr = await tail_window(tiny_whisper, 28.8, invented)
    assert tr.windows == 2 and tr.text().endswith(" Seven of Hearts.") and tr.seek == 2950
    assert tr.transcript(29.5).text == tr.text() and tr.last_speech_timestamp == 28.8
    # words the audio holds stay
    said = [(" Seven", 28.8, 29.1, 0.9), (" of", 29.1, 29.25, 0.9), (" Clothes.", 29.25, 29.5, 0.8)]
    assert (await tail_window(tiny_whisper, 28.8, said)).text().endswith(" Seven of Hearts. Seven of Clothes.")
    # a window from the last timestamp is Whisper's own (decoded without word timestamps too): kept as it is
    invented = [(" Seven", 29.0, 29.5, 0.0), (" of", 29.5, 29.5, 0.02), (" Clothes.", 29.5, 29.5, 0.01)]
    tr = await tail_window(tiny_whisper, 29.0, invented)
    assert tr.windows == 2 and tr.text().endswith(" Seven of Hearts. Seven of Clothes.")


async def test_words_mapped_through_a_timeline_stay_inside_their_segment(tiny_whisper: LoadedWhisper) -> None:
    # With VAD a window's first word began where the previous one ended, in the pad before a removed pause: mapped
    # alone, ('And', 31.87, 33.49) in a segment from 32.83. Words map as their segment does, inside it.
    second = 16000
    _, timeline = compact(np.zeros(30 * second, np.float32), [(0, 10 * second), (12 * second, 20 * second)])
    options = TranscribeOptions(temperatures=(0.0,), word_timestamps=True)
    tr = await WindowedTranscription.start(tiny_whisper, options, timeline=timeline)

    def seg(start: float, end: float, *words: tuple[str, float, float]) -> dict:
        return {"seek": 0, "start": start, "end": end, "text": "".join(w for w, _, _ in words), "tokens": [1],
                "temperature": 0.0, "avg_logprob": -0.2, "compression_ratio": 1.2, "no_speech_prob": 0.1,
                "words": [{"word": w, "start": a, "end": b, "probability": 0.9} for w, a, b in words]}

    man, first = tr.commit([seg(8.0, 10.3, (" young", 8.0, 9.5), (" man.", 9.5, 10.3)),
                            seg(9.85, 11.2, (" And", 9.85, 10.6), (" then.", 10.6, 11.2))])
    assert (man.start, man.end) == (8.0, 10.0) and (first.start, first.end) == (12.0, 13.2)
    assert [(w.start, w.end) for w in man.words] == [(8.0, 9.5), (9.5, 10.0)]
    assert [(w.start, w.end) for w in first.words] == [(12.0, 12.6), (12.6, 13.2)]
    for s in (man, first):
        assert all(s.start <= w.start <= w.end <= s.end for w in s.words)


async def test_windows_after_a_long_removed_silence_are_conditioned_as_a_new_files(tiny_whisper: LoadedWhisper) -> None:
    # Conditioned on five card names, tiny.en wrote " 7 of clubs." thrice over the LibriVox sentence that followed
    # 6 s of removed silence (joined6: WER 0.69, mlx_whisper 0.0). From a break: the client's prompt, then own text.
    second = 16000
    pcm = np.zeros(100 * second, np.float32)
    speech, timeline = compact(pcm, [(0, 5 * second), (6 * second, 10 * second), (50 * second, 95 * second)])
    tr = await WindowedTranscription.start(tiny_whisper, TranscribeOptions(
        temperatures=(0.0,), without_timestamps=True, prompt="Cards."), timeline=timeline)
    tr.break_gap = 2.0
    tok, client = tr.tokenizer, tuple(tr.initial_prompt_tokens)
    said = [tok.encode(f" {text}") for text in ("Ten of clubs.", "And Mr. John Dashwood.", "He was not.")]
    scheduler = ScriptedScheduler(*said)
    while (w := tr.next_window(len(speech), final=True)) is not None:
        await tr.step(speech[w[0]: w[0] + N_SAMPLES], w[1], scheduler, None)  # type: ignore[arg-type]
    first, after_break, later = (r.prompt for r in scheduler.requests)
    assert first == client
    assert after_break == client  # not " Cards. Ten of clubs.": the card names stay behind the silence
    assert later == client + tuple(said[1])  # the text since the break conditions the windows after it
    assert tr.text() == " Ten of clubs. And Mr. John Dashwood. He was not."
    # without break_gap (a live session's windows) the conditioning runs on as Whisper's
    assert not (await WindowedTranscription.start(tiny_whisper, FAST, timeline=timeline)).at_break()


async def test_a_files_windows_keep_their_tokens_log_probabilities_only_when_asked(tiny_whisper: LoadedWhisper) -> None:
    # include[]=logprobs on a file: every window's decode keeps them; each segment carries its own tokens' (their bytes
    # join to its text, a character split across tokens too), the transcript all of them one after another
    from tests.fixtures.scripted_scheduler import scripted_logprob as lp

    for asked in (True, False):
        tr = await WindowedTranscription.start(tiny_whisper, TranscribeOptions(temperatures=(0.0,), logprobs=asked))
        tok, ts = tr.tokenizer, tr.tokenizer.timestamp_begin
        ten, cup, yes = tok.encode(" Ten of clubs."), tok.encode(" A cup ☕."), tok.encode(" Yes.")
        assert any(not tok.encoding.decode_single_token_bytes(t).decode(errors="ignore") for t in cup)  # split ☕
        scheduler, pcm = ScriptedScheduler([ts, *ten, ts + 500, ts + 500, *cup, ts + 1000], [ts, *yes, ts + 300]), \
            noise(40)
        streamed = []
        while (w := tr.next_window(len(pcm), final=True)) is not None:
            streamed += await tr.step(pcm[w[0]: w[0] + N_SAMPLES], w[1], scheduler, None)  # type: ignore[arg-type]
        t = tr.transcript(40.0)
        assert [r.logprobs for r in scheduler.requests] == [asked, asked]  # not asked: no decode keeps any
        assert [s.text for s in t.segments] == [" Ten of clubs.", " A cup ☕.", " Yes."]
        if not asked:
            assert t.logprobs is None and all(s.logprobs is None for s in (*t.segments, *streamed))
            continue
        for s in (*t.segments, *streamed):
            assert s.logprobs is not None and bytes(b for e in s.logprobs for b in e.bytes).decode() == s.text
        # each token's value is its decode's, at the position it was sampled at (each window's decode its own)
        assert [[e.logprob for e in s.logprobs or ()] for s in t.segments] == [
            [lp(1 + i) for i in range(len(ten))], [lp(3 + len(ten) + i) for i in range(len(cup))],
            [lp(1 + i) for i in range(len(yes))]]
        assert t.logprobs == tuple(e for s in t.segments for e in s.logprobs or ())
        assert bytes(b for e in t.logprobs or () for b in e.bytes).decode() == t.text
        assert [s.logprobs for s in streamed] == [s.logprobs for s in t.segments]  # the stream's as the transcript's


async def test_a_decodes_log_probabilities_are_its_final_rungs(tiny_whisper: LoadedWhisper) -> None:
    # every decode fails a threshold of 0: the fallback climbs to its last rung, and the segments carry that decode's
    options = TranscribeOptions(logprobs=True, temperatures=(0.0, 1.0), without_timestamps=True, logprob_threshold=0.0,
                                no_speech_threshold=None)
    tr, _ = await transcribe(tiny_whisper, noise(6, seed=1), options, seed=7)  # the same draws every run
    t = tr.transcript(6.0)
    assert t.segments and t.logprobs is not None
    for s in t.segments:
        text = [x for x in s.tokens if x < tr.tokenizer.eot]
        assert s.temperature == 1.0 and s.logprobs is not None and len(s.logprobs) == len(text)
        # sampled hot, a segment may end inside a character: its text shows U+FFFD there, as its bytes decode
        assert bytes(b for e in s.logprobs for b in e.bytes).decode(errors="replace") == s.text
        assert all(FLOOR < e.logprob <= 0 for e in s.logprobs)
        # its row's score: these and its end of text's (≤ 0), as mlx-whisper averages them
        assert sum(e.logprob for e in s.logprobs) >= s.avg_logprob * (len(text) + 1) - 1e-3
    assert bytes(b for e in t.logprobs for b in e.bytes).decode(errors="replace") == t.text
