"""audio/decoder.py: a row alone decodes exactly as mlx-whisper's decode loop; rows packed together pick the
same tokens as rows alone; a forced prefix starts every hypothesis; sampling is keyed per row."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_whisper.decoding import DecodingOptions

from audio.decoder import DecodeRow, advance_rows, detect_language, finish_row, new_row, step_rows
from audio.encoder import EncoderJob, mel_window, run_unit
from audio.whisper import LoadedWhisper


def encoded(loaded: LoadedWhisper, seconds: float, seed: int) -> tuple[EncoderJob, mx.array]:
    audio = np.random.default_rng(seed).normal(0, 0.1, int(seconds * 16000)).astype(np.float32)
    # MLX's own math: mlx-whisper's decode runs the one-call encoder on `mel`, and these tests hold the decoder
    # to its exact bits (the numpy path's encoder differs by rounding: tests/audio/test_encoder.py).
    job = EncoderJob(audio, int(seconds * 100), 1500, fp16=False, numpy_math=False)
    while not job.done:
        run_unit(loaded.model, [job])
    return job, mel_window(loaded.model, audio, int(seconds * 100), fp16=False)


# On a GPU the encoder in units equals mlx-whisper's one call only to rounding (tests/audio/test_encoder.py), and
# so do the probabilities decoded from it; on the CPU they are bitwise the same.
EXACT = mx.default_device().type == mx.DeviceType.cpu


def same(a: float, b: float) -> bool:
    """Equal to float32 rounding (a GPU's: 1e-4), NaN included (a random model's masked logits make mlx-whisper's
    avg_logprob NaN too). A CPU's BLAS may sum in another order once a test changed its thread count: 1 ulp apart."""
    rtol = 1e-6 if EXACT else 1e-4
    return a == b or (np.isnan(a) and np.isnan(b)) or bool(np.isclose(a, b, rtol=rtol, atol=0))


def run(loaded: LoadedWhisper, rows: list[DecodeRow], tokens: int = 4) -> None:
    while not all(r.done for r in rows):
        advance_rows(loaded.model, rows, tokens)


OPTIONS = [DecodingOptions(language="en", fp16=False, without_timestamps=True),
           DecodingOptions(language="en", fp16=False),
           DecodingOptions(language="en", fp16=False, prompt=[400, 401, 402, 403])]


@pytest.mark.parametrize("options", OPTIONS, ids=["no-timestamps", "timestamps", "prompt"])
def test_a_row_alone_is_mlx_whispers_decode(tiny_whisper: LoadedWhisper, options: DecodingOptions) -> None:
    job, mel = encoded(tiny_whisper, 6, seed=3)
    reference = tiny_whisper.model.decode(mel, options)
    row = new_row(tiny_whisper.model, options, job.cross_kv, [])
    run(tiny_whisper, [row])
    got = finish_row(row)
    assert got.sampled == reference.tokens and got.text == reference.text
    assert same(got.avg_logprob, reference.avg_logprob) and same(got.no_speech_prob, reference.no_speech_prob)
    assert got.compression_ratio == reference.compression_ratio and got.temperature == 0.0


def test_packed_rows_pick_the_tokens_rows_alone_pick(tiny_whisper: LoadedWhisper) -> None:
    windows = [encoded(tiny_whisper, s, seed=s)[0] for s in (2, 9, 17, 30)]
    plans = [(w, o) for w, o in zip(windows, OPTIONS + OPTIONS[:1])]
    alone = []
    for job, options in plans:
        row = new_row(tiny_whisper.model, options, job.cross_kv, [])
        run(tiny_whisper, [row])
        alone.append(finish_row(row))
    together = [new_row(tiny_whisper.model, o, j.cross_kv, []) for j, o in plans]
    run(tiny_whisper, together, tokens=3)
    for a, row in zip(alone, together):
        b = finish_row(row)
        assert b.sampled == a.sampled and b.text == a.text
        # scores agree to float32 rounding: BLAS picks other kernels for other row counts
        assert same(a.avg_logprob, b.avg_logprob) or b.avg_logprob == pytest.approx(a.avg_logprob, abs=1e-5)


def test_each_call_advances_each_row_by_at_most_the_bound(tiny_whisper: LoadedWhisper) -> None:
    job, _ = encoded(tiny_whisper, 4, seed=5)
    rows = [new_row(tiny_whisper.model, OPTIONS[0], job.cross_kv, []) for _ in range(3)]
    seen = [0, 0, 0]
    while not all(r.done for r in rows):
        advance_rows(tiny_whisper.model, rows, 2)
        for i, r in enumerate(rows):
            assert r.sampled - seen[i] <= 2
            seen[i] = r.sampled
    assert all(r.sampled >= 1 for r in rows)


def test_a_prompt_fed_in_chunks_decodes_what_it_decodes_fed_whole(tiny_whisper: LoadedWhisper) -> None:
    options = DecodingOptions(language="en", fp16=False, prompt=list(range(400, 430)))
    job, _ = encoded(tiny_whisper, 6, seed=7)
    whole = new_row(tiny_whisper.model, options, job.cross_kv, [400, 401])
    run(tiny_whisper, [whole])
    chunked = new_row(tiny_whisper.model, options, job.cross_kv, [400, 401])
    plain = new_row(tiny_whisper.model, OPTIONS[0], job.cross_kv, [])
    first = len(plain.task.initial_tokens)
    forwards = []
    while not (chunked.done and plain.done):
        forwards.append(step_rows(tiny_whisper.model, [chunked, plain], feed=8))
    # the 30-token prompt, SOT sequence and prefix take several forwards; the other row samples meanwhile
    assert [f.sampled for f in forwards[:3]] == [1, 1, 1] and forwards[0].tokens == 8 + first
    assert all(f.tokens <= 9 for f in forwards[1:])
    a, b = finish_row(whole), finish_row(chunked)
    assert b.sampled == a.sampled and b.text == a.text and b.no_speech_prob == pytest.approx(a.no_speech_prob)


def test_a_forced_prefix_starts_the_hypothesis(tiny_whisper: LoadedWhisper) -> None:
    job, _ = encoded(tiny_whisper, 5, seed=7)
    ts = new_row(tiny_whisper.model, OPTIONS[1], job.cross_kv, []).task.tokenizer.timestamp_begin  # <|0.00|>
    prefix = [ts, 1000, 1001]  # mid-segment: text after an opening timestamp
    row = new_row(tiny_whisper.model, OPTIONS[1], job.cross_kv, prefix)
    run(tiny_whisper, [row])
    got = finish_row(row)
    assert got.tokens[:3] == prefix and got.tokens[3:] == got.sampled
    plain = new_row(tiny_whisper.model, OPTIONS[1], job.cross_kv, [])
    run(tiny_whisper, [plain])
    assert finish_row(plain).tokens[:1] != [1000]  # unforced, a hypothesis opens with a timestamp


def test_sampled_rows_draw_the_same_tokens_alone_and_packed(tiny_whisper: LoadedWhisper) -> None:
    job, _ = encoded(tiny_whisper, 3, seed=9)
    hot = DecodingOptions(language="en", fp16=False, temperature=1.0, without_timestamps=True)
    alone = new_row(tiny_whisper.model, hot, job.cross_kv, [], seed=11)
    run(tiny_whisper, [alone])
    packed = [new_row(tiny_whisper.model, hot, job.cross_kv, [], seed=s) for s in (5, 11, 12)]
    run(tiny_whisper, packed)
    assert finish_row(packed[1]).sampled == finish_row(alone).sampled
    assert finish_row(packed[0]).sampled != finish_row(packed[2]).sampled  # other keys, other draws


def test_a_row_keeps_each_sampled_tokens_logprob_alone_and_packed(tiny_whisper: LoadedWhisper) -> None:
    """Asked for (a live session's logprobs), each sampled token's log probability is kept, read once when the row
    finishes: the same whether the row picked alone (its sampler's update) or beside others (sample_together)."""
    job, _ = encoded(tiny_whisper, 6, seed=3)
    alone = new_row(tiny_whisper.model, OPTIONS[0], job.cross_kv, [])
    alone.logprobs = []
    run(tiny_whisper, [alone])
    got = finish_row(alone)
    assert got.logprobs is not None and len(got.logprobs) == len(got.sampled) > 0
    assert all(np.isfinite(x) and x <= 0 for x in got.logprobs)
    total = got.avg_logprob * (len(got.sampled) + 1)  # the row's sum: its sampled tokens' and an EOT's, if drawn
    if len(got.sampled) == alone.task.sample_len:
        assert sum(got.logprobs) == pytest.approx(total, rel=1e-5)
    else:
        assert sum(got.logprobs) >= total - 1e-3
    packed = [new_row(tiny_whisper.model, OPTIONS[0], job.cross_kv, []) for _ in range(3)]
    packed[1].logprobs = []
    run(tiny_whisper, packed)
    beside = finish_row(packed[1])
    assert beside.sampled == got.sampled and beside.logprobs == pytest.approx(got.logprobs, rel=1e-5, abs=1e-6)
    assert finish_row(packed[0]).logprobs is None  # not asked for: not kept


class _ScriptedLogits:
    """A multilingual model whose first decoder step gives scripted logits: `scores` by language code, every
    other language token far below them."""

    is_multilingual, num_languages = True, 99

    def __init__(self, scores: dict[str, float]) -> None:
        from mlx_whisper.tokenizer import get_tokenizer

        tokenizer = get_tokenizer(True, num_languages=99)
        logits = np.full(51865, -1e4, np.float32)
        logits[list(tokenizer.all_language_tokens)] = -50.0
        for code, score in scores.items():
            logits[tokenizer.to_language_token(code)] = score
        self._logits = mx.array(logits)[None, None]

    def logits(self, tokens: mx.array, features: mx.array) -> mx.array:
        return self._logits


def test_detection_among_given_languages_takes_the_most_probable_of_their_tokens() -> None:
    # OpenAI's `languages`: French (second overall) wins among French and German, where English would win among all
    model = _ScriptedLogits({"en": 9.0, "fr": 5.0, "de": 3.0, "ja": 8.0})
    assert detect_language(model, None) == "en"
    assert detect_language(model, None, ("de", "fr")) == "fr"
    assert detect_language(model, None, ("de",)) == "de"
    assert detect_language(model, None, ("sw", "fr", "ja")) == "ja"


def test_detection_among_given_languages_is_the_restricted_argmax_of_mlx_whispers(
        multilingual_whisper: LoadedWhisper) -> None:
    model = multilingual_whisper.model
    for seed in range(3):
        job, _ = encoded(multilingual_whisper, 3, seed)
        _, probs = model.detect_language(job.features)
        ranked = sorted(probs[0], key=probs[0].get, reverse=True)
        among = (ranked[7], ranked[3], ranked[40])  # never the unrestricted winner
        assert detect_language(model, job.features, among) == ranked[3] != detect_language(model, job.features)


def test_the_language_detected_from_features_is_mlx_whispers(multilingual_whisper: LoadedWhisper) -> None:
    model = multilingual_whisper.model
    assert model.is_multilingual
    for seed in range(3):
        job, _ = encoded(multilingual_whisper, 3, seed)
        _, probs = model.detect_language(job.features)
        assert detect_language(model, job.features) == max(probs[0], key=probs[0].get)
