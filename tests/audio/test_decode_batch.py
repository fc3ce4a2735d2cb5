"""audio/decode_batch.py: rows that only feed their last token decode over stacked caches and pick the tokens
they pick with attention per row (rows finishing apart, joining mid-way, encoded over other contexts); the
batch is kept while the same rows go on, its forward compiled, and both used by default on a GPU only."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
import numpy as np
import pytest
from mlx_whisper.decoding import DecodingOptions

import audio.decode_batch as decode_batch
import audio.decoder as decoder
from audio.batch_sampling import sample_together
from audio.decoder import DecodeRow, RowResult, advance_rows, finish_row, new_row, step_rows
from audio.encoder import EncoderJob, fitted_context, run_unit
from audio.whisper import LoadedWhisper, load_whisper

OPTIONS = [DecodingOptions(language="en", fp16=False, without_timestamps=True),
           DecodingOptions(language="en", fp16=False),
           DecodingOptions(language="en", fp16=False, prompt=[400, 401, 402, 403]),
           DecodingOptions(language="en", fp16=False, temperature=0.8)]


def encoded(loaded: LoadedWhisper, seconds: float, seed: int, fitted: bool = False) -> EncoderJob:
    samples = int(seconds * 16000)
    audio = np.random.default_rng(seed).normal(0, 0.1, samples).astype(np.float32)
    n_ctx = fitted_context(1500, samples, 5.0) if fitted else None
    job = EncoderJob(audio, int(seconds * 100), 1500, fp16=False, numpy_math=False, n_ctx=n_ctx)
    while not job.done:
        run_unit(loaded.model, [job])
    return job


def decode(loaded: LoadedWhisper, jobs: list[EncoderJob], join_after: int | None = None,
           sample_len: int | None = None) -> list[RowResult]:
    """Every job's row decoded together (the last one joins after `join_after` forwards when set)."""
    rows = [new_row(loaded.model, OPTIONS[i % len(OPTIONS)], j.cross_kv, [], seed=i) for i, j in enumerate(jobs)]
    for i, r in enumerate(rows):  # rows finishing at different forwards: the batch is rebuilt without them
        r.task.sample_len = sample_len + 3 * i if sample_len else r.task.sample_len
    waiting = rows[-1:] if join_after is not None else []
    active = rows[:-1] if join_after is not None else rows
    forwards = 0
    while not all(r.done for r in rows):
        if waiting and forwards >= (join_after or 0):
            active, waiting = active + waiting, []
        step_rows(loaded.model, active)
        forwards += 1
    return [finish_row(r) for r in rows]


def alone(loaded: LoadedWhisper, jobs: list[EncoderJob], sample_len: int | None = None) -> list[RowResult]:
    out = []
    for i, j in enumerate(jobs):
        row = new_row(loaded.model, OPTIONS[i % len(OPTIONS)], j.cross_kv, [], seed=i)
        row.task.sample_len = sample_len + 3 * i if sample_len else row.task.sample_len
        while not row.done:
            advance_rows(loaded.model, [row], 4)
        out.append(finish_row(row))
    return out


@pytest.fixture(params=["off", "on"], ids=["plain", "compiled"])
def batched(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> list[int]:
    """The batch on (as on a GPU), its forward run as built or mx.compile'd (as on a GPU); counts its builds."""
    monkeypatch.setenv("TANDEM_WHISPER_BATCH", "on")
    monkeypatch.setenv("TANDEM_WHISPER_COMPILE", request.param)
    builds: list[int] = []
    build = decode_batch.RowBatch.build.__func__  # type: ignore[attr-defined]

    def counting(cls: type, rows: list[DecodeRow], *args: object) -> decode_batch.RowBatch:
        builds.append(len(rows))
        return build(cls, rows, *args)  # type: ignore[no-any-return]

    monkeypatch.setattr(decode_batch.RowBatch, "build", classmethod(counting))
    return builds


def same_tokens(a: list[RowResult], b: list[RowResult]) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.sampled == y.sampled and x.text == y.text
        assert (np.isnan(x.avg_logprob) and np.isnan(y.avg_logprob)) or x.avg_logprob == pytest.approx(y.avg_logprob,
                                                                                                      abs=1e-5)


def test_batched_rows_pick_the_tokens_rows_alone_pick(tiny_whisper: LoadedWhisper, batched: list[int],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = [encoded(tiny_whisper, s, seed=s) for s in (2, 9, 17, 30, 5)]
    with pytest.MonkeyPatch.context() as m:
        m.setenv("TANDEM_WHISPER_BATCH", "off")
        reference = alone(tiny_whisper, jobs, sample_len=6)
    assert not batched
    together: list[int] = []  # the batch's rows also pick their tokens together (audio/batch_sampling.py)
    monkeypatch.setattr(decoder, "sample_together", lambda rows, logits: together.append(len(rows))
                        or sample_together(rows, logits))
    same_tokens(reference, decode(tiny_whisper, jobs, sample_len=6))
    assert together and max(together) == 5
    # built once, then again each time a row finished (6, 9, 12, 15 tokens): never once a forward
    assert batched == [5, 4, 3, 2]


def test_finished_rows_let_their_batch_go(tiny_whisper: LoadedWhisper, batched: list[int]) -> None:
    jobs = [encoded(tiny_whisper, s, seed=s) for s in (3, 6)]
    rows = [new_row(tiny_whisper.model, OPTIONS[0], j.cross_kv, [], seed=i) for i, j in enumerate(jobs)]
    for r in rows:
        r.task.sample_len = 5
    step_rows(tiny_whisper.model, rows)
    step_rows(tiny_whisper.model, rows)
    assert rows[0].batch is not None
    first = weakref.ref(rows[0].batch[0])
    while not all(r.done for r in rows):
        step_rows(tiny_whisper.model, rows)
    # the rows live on (their windows read their results) but hold neither the stacked caches nor their own
    assert first() is None and all(r.batch is None and r.kv == [None, None] for r in rows)


def test_a_row_joining_mid_way_and_other_contexts_pick_the_same_tokens(tiny_whisper: LoadedWhisper,
                                                                       batched: list[int]) -> None:
    # fitted contexts of 5 and 10 s: the cross-attention keys past a row's own context are masked
    jobs = [encoded(tiny_whisper, s, seed=s, fitted=True) for s in (3, 8, 2)]
    assert len({j.cross_kv[0][1].shape[2] for j in jobs}) == 2
    with pytest.MonkeyPatch.context() as m:
        m.setenv("TANDEM_WHISPER_BATCH", "off")
        reference = alone(tiny_whisper, jobs, sample_len=10)
    # the third row's prompt forward runs per row; the others' keys come back out of their batch for it
    same_tokens(reference, decode(tiny_whisper, jobs, join_after=3, sample_len=10))
    assert batched[:2] == [2, 3]


def test_the_batch_and_its_compiled_forward_are_on_by_default_on_a_gpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TANDEM_WHISPER_BATCH", raising=False)
    monkeypatch.delenv("TANDEM_WHISPER_COMPILE", raising=False)
    on_gpu = mx.default_device().type == mx.DeviceType.gpu
    assert decode_batch.batch_enabled() == on_gpu and decode_batch.compile_enabled() == on_gpu
    monkeypatch.setenv("TANDEM_WHISPER_BATCH", "off")
    monkeypatch.setenv("TANDEM_WHISPER_COMPILE", "off")
    assert not decode_batch.batch_enabled() and not decode_batch.compile_enabled()


def test_the_compiled_forward_gives_the_same_bits_and_goes_with_its_model(tiny_whisper_dir: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # Its own copy of the model: the traced graphs hold the weights, and must let them go with the model (Whisper's
    # idle unload) by reference counts alone: a model loaded before the server's gc.freeze is never collected.
    loaded = load_whisper(tiny_whisper_dir, dtype="float32")
    jobs = [encoded(loaded, s, seed=s, fitted=True) for s in (3, 8, 4)]  # two contexts: masked cross keys
    monkeypatch.setenv("TANDEM_WHISPER_BATCH", "on")
    rows = [new_row(loaded.model, OPTIONS[0], j.cross_kv, [], seed=i) for i, j in enumerate(jobs)]
    step_rows(loaded.model, rows)  # prompts, per row
    step_rows(loaded.model, rows)  # builds the batch
    batch = rows[0].batch[0]
    dec = loaded.model.decoder
    slots = (list(batch.keys), list(batch.values))
    outs = {}
    for mode in ("off", "on"):
        monkeypatch.setenv("TANDEM_WHISPER_COMPILE", mode)
        batch.keys, batch.values = list(slots[0]), list(slots[1])
        logits = batch.logits(dec)
        mx.eval(logits, batch.keys, batch.values)
        outs[mode] = [np.array(a) for a in (logits, *batch.keys, *batch.values)]
    assert all(np.array_equal(a, b) for a, b in zip(outs["off"], outs["on"], strict=True))
    assert "_tandem_compiled" in dec.__dict__  # the compiled forward, kept on the decoder
    weights = sum(v.nbytes for _, v in tree_flatten(loaded.model.parameters()))
    gone = weakref.ref(dec)
    del rows, batch, jobs, slots  # made while serving (collectable); the model is older than the freeze:
    gc.collect()
    gc.disable()
    try:
        before = mx.get_active_memory()
        del loaded, dec
        # the decoder went, and with it the traced graphs: every weight's memory is free again
        assert gone() is None and before - mx.get_active_memory() >= weights
    finally:
        gc.enable()


def test_rows_taking_turns_share_one_batch_and_pick_the_same_tokens(tiny_whisper: LoadedWhisper,
                                                                    batched: list[int]) -> None:
    # Paced steps forward the rows in turns (a rotating start, as many as fit): the rows that take turns with
    # the first ones (`company`) join their batch, which then serves any of its rows.
    jobs = [encoded(tiny_whisper, s, seed=s) for s in (4, 7, 11, 6)]
    with pytest.MonkeyPatch.context() as m:
        m.setenv("TANDEM_WHISPER_BATCH", "off")
        reference = alone(tiny_whisper, jobs, sample_len=8)
    rows = [new_row(tiny_whisper.model, OPTIONS[i % len(OPTIONS)], j.cross_kv, [], seed=i) for i, j in enumerate(jobs)]
    for i, r in enumerate(rows):
        r.task.sample_len = 8 + 3 * i
    step_rows(tiny_whisper.model, rows)  # prompts, per row
    turn = 0
    while not all(r.done for r in rows):
        live = [r for r in rows if not r.done]
        start = turn % len(live)
        step_rows(tiny_whisper.model, (live[start:] + live[:start])[:2], company=live)  # two at a time, in turns
        turn += 2
    same_tokens(reference, [finish_row(r) for r in rows])
    assert batched == [4, 3, 2]  # all four from the first turn; rebuilt as rows finish, not at every turn


def test_rows_in_a_batch_keep_their_context_on_the_host(tiny_whisper: LoadedWhisper, batched: list[int]) -> None:
    # A batch's rows feed their last token and append the next from one read of the step's draws: none of them
    # builds its context as an array of its own (on a GPU one managed copy a row per token), and the context they
    # keep is the tokens a row alone holds.
    jobs = [encoded(tiny_whisper, s, seed=s) for s in (3, 11, 6)]
    rows = [new_row(tiny_whisper.model, OPTIONS[1], j.cross_kv, [], seed=i) for i, j in enumerate(jobs)]
    for _ in range(2):  # the prompts (SOT sequences), fed per row
        step_rows(tiny_whisper.model, rows)
    for _ in range(4):
        step_rows(tiny_whisper.model, rows)
        assert all(r._array is None for r in rows if not r.done)
    assert batched  # they decoded in a batch
    for i, (r, j) in enumerate(zip(rows, jobs)):
        own = new_row(tiny_whisper.model, OPTIONS[1], j.cross_kv, [], seed=i)
        for _ in range(r.sampled):
            step_rows(tiny_whisper.model, [own])
        assert r.context == own.tokens.tolist()[0] and r.length == len(r.context)
