"""audio/batch_sampling.py: rows sampling together pick, score and append what each row's own mlx-whisper
filters and keyed sampler would (timestamps in pairs, the first sample, blanks, sampled rows, ended rows), also
after a forward with attention per row."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlx_whisper.decoding import ApplyTimestampRules, DecodingOptions

import audio.decoder as decoder
from audio.batch_sampling import KeyedSampler, apply_timestamp_rules, can_sample_together, sample_together
from audio.decoder import DecodeRow, finish_row, new_row, step_rows
from audio.encoder import EncoderJob, run_unit
from audio.whisper import LoadedWhisper

OPTIONS = [DecodingOptions(language="en", fp16=False, without_timestamps=True),
           DecodingOptions(language="en", fp16=False),
           DecodingOptions(language="en", fp16=False, prompt=[400, 401, 402, 403]),
           DecodingOptions(language="en", fp16=False, temperature=0.8),
           DecodingOptions(language="en", fp16=False, max_initial_timestamp=0.5)]


def rows_with_histories(loaded: LoadedWhisper) -> list[DecodeRow]:
    """Rows at their first sample, after text, after one and two timestamps, and after the end of text."""
    rows = []
    for i, options in enumerate(OPTIONS * 2):
        row = new_row(loaded.model, options, [], [], seed=i)
        t = row.task.tokenizer
        begin = t.timestamp_begin
        tails = [[], [300, 301], [begin + 3], [begin + 1, 320, begin + 4], [begin + 2, begin + 2], [t.eot]]
        tail = tails[i % len(tails)]
        if tail:
            row.tokens = mx.concatenate([row.tokens, mx.array([tail])], axis=-1)
        row.sum_logprobs = mx.array([-0.5 * i], dtype=mx.float32)
        rows.append(row)
    return rows


def test_rows_sampled_together_pick_what_each_row_picks_alone(tiny_whisper: LoadedWhisper) -> None:
    rows = rows_with_histories(tiny_whisper)
    vocab = tiny_whisper.model.dims.n_vocab
    logits = mx.array(np.random.default_rng(0).normal(0, 3, (len(rows), vocab)).astype(np.float32))
    # rows after text: a timestamp far ahead, so the "timestamps beat text" rule decides; the first sample of
    # a row without timestamps: end of text ahead, which SuppressBlank forbids there
    boost = np.zeros((len(rows), vocab), np.float32)
    boost[[1, 7], rows[0].task.tokenizer.timestamp_begin + 5] = 40.0
    boost[0, rows[0].task.tokenizer.eot] = 40.0
    logits = logits + mx.array(boost)
    alone = rows_with_histories(tiny_whisper)  # the same rows again (a deepcopy copied the model; it fails on a GPU)
    done_alone = []
    for i, r in enumerate(alone):
        one = logits[i:i + 1]
        for f in r.task.logit_filters:
            one = f.apply(one, r.tokens)
        r.tokens, done, r.sum_logprobs = r.task.decoder.update(r.tokens, one, r.sum_logprobs)
        done_alone.append(bool(done.item()))
    assert can_sample_together(rows)
    eot = rows[0].task.tokenizer.eot
    done_together = [t == eot for t in sample_together(rows, logits).ids()]
    assert done_together == done_alone and any(done_alone)
    for a, b in zip(alone, rows):
        assert a.tokens.tolist() == b.tokens.tolist()
        # an ended row scores -inf * 0 (NaN), alone as together
        np.testing.assert_array_equal(np.array(a.sum_logprobs), np.array(b.sum_logprobs))
        assert a.task.decoder.index == b.task.decoder.index == 1
    picked = {r.tokens.tolist()[0][-1] for r in rows}
    assert len(picked) > 3  # the filters and samplers made different rows pick differently


def test_rows_with_other_filters_or_samplers_sample_alone(tiny_whisper: LoadedWhisper) -> None:
    rows = rows_with_histories(tiny_whisper)[:3]
    assert can_sample_together(rows) and all(type(r.task.decoder) is KeyedSampler for r in rows)
    keyed = rows[2].task.decoder
    rows[2].task.decoder = object()  # another sampler type
    assert not can_sample_together(rows)
    rows[2].task.decoder = keyed
    rows[1].task.logit_filters = list(reversed(rows[1].task.logit_filters))  # another order
    assert not can_sample_together(rows)


def test_rows_of_a_packed_forward_sample_together_without_the_batch(tiny_whisper: LoadedWhisper,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Attention per row (the CPU's way), sampling together: the same tokens and scores as each row alone.
    monkeypatch.setenv("TANDEM_WHISPER_BATCH", "off")
    jobs = []
    for seed, seconds in enumerate((3, 7, 5)):
        audio = np.random.default_rng(seed).normal(0, 0.1, seconds * 16000).astype(np.float32)
        job = EncoderJob(audio, seconds * 100, 1500, fp16=False, numpy_math=False)
        while not job.done:
            run_unit(tiny_whisper.model, [job])
        jobs.append(job)
    alone = []
    for i, job in enumerate(jobs):
        row = new_row(tiny_whisper.model, OPTIONS[i], job.cross_kv, [], seed=i)
        while not row.done:
            step_rows(tiny_whisper.model, [row])
        alone.append(finish_row(row))
    together: list[int] = []
    monkeypatch.setattr(decoder, "sample_together", lambda rows, logits: together.append(len(rows))
                        or sample_together(rows, logits))
    rows = [new_row(tiny_whisper.model, OPTIONS[i], job.cross_kv, [], seed=i) for i, job in enumerate(jobs)]
    while not all(r.done for r in rows):
        step_rows(tiny_whisper.model, rows)
    assert together and max(together) == 3
    for a, r in zip(alone, rows):
        b = finish_row(r)
        assert a.sampled == b.sampled and (a.avg_logprob == b.avg_logprob or np.isnan(a.avg_logprob))


@pytest.mark.parametrize("last", ["text", "end"])
def test_the_keyed_sampler_picks_and_scores_as_mlx_whispers_greedy_decoder(last: str) -> None:
    # A row alone and rows together select through the same code: this checks that code against mlx-whisper's
    # own GreedyDecoder (after text: the pick's log-probability counts; after end of text: nothing counts, end again).
    from mlx_whisper.decoding import GreedyDecoder

    eot, vocab = 50256, 51864
    tokens = mx.array([[50257, 300, 301 if last == "text" else eot]])
    logits = mx.array(np.random.default_rng(1).normal(0, 3, (1, vocab)).astype(np.float32))
    theirs = GreedyDecoder(0.0, eot).update(tokens, logits, mx.array([-1.5], dtype=mx.float32))
    ours = KeyedSampler(0.0, eot, seed=3).update(tokens, logits, mx.array([-1.5], dtype=mx.float32))
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(np.array(a), np.array(b))
    assert (float(ours[2][0]) == -1.5) == (last == "end")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tails=st.lists(st.lists(st.sampled_from(["text", "eot", "ts", "ts0", "ts_late"]), max_size=7),
                      min_size=1, max_size=6),
       seed=st.integers(0, 2**16))
def test_timestamp_rules_of_rows_together_mask_what_mlx_whisper_masks_per_row(tiny_whisper: LoadedWhisper,
                                                                             tails: list[list[str]],
                                                                             seed: int) -> None:
    # Any row history (text, end of text, timestamps in and out of pairs, the first sample, a max initial
    # timestamp or none): the ranges sent to the device forbid exactly what ApplyTimestampRules' host mask does.
    rows = [new_row(tiny_whisper.model, OPTIONS[1 + 3 * (i % 2)], [], []) for i in range(len(tails))]
    t = rows[0].task.tokenizer
    begin = t.timestamp_begin
    kinds = {"text": 300, "eot": t.eot, "ts": begin + 7, "ts0": begin, "ts_late": begin + 40}
    histories = [r.context + [kinds[k] for k in tail] for r, tail in zip(rows, tails)]
    rules = [next(f for f in r.task.logit_filters if isinstance(f, ApplyTimestampRules)) for r in rows]
    vocab = tiny_whisper.model.dims.n_vocab
    logits = mx.array(np.random.default_rng(seed).normal(0, 3, (len(rows), vocab)).astype(np.float32))
    got = np.array(apply_timestamp_rules(logits, rules, histories))
    want = np.concatenate([np.array(f.apply(logits[i:i + 1], mx.array([h])))
                           for i, (f, h) in enumerate(zip(rules, histories))])
    np.testing.assert_array_equal(got, want)
