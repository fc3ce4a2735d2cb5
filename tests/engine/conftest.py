"""Fixtures for the engine's tests."""

from __future__ import annotations

import json
from typing import Any

import mlx.core as mx
import pytest


@pytest.fixture
def stand_in_kernels(monkeypatch) -> list[tuple[str, int]]:
    """engine/fused_gemv.py's CUDA kernels served by MLX's own ops on any machine, as if on CUDA (enabled, and
    available for up to MAX_ROWS rows). Returns the (kernel, rows) calls they record (at trace time when compiled)."""
    from mlx_lm.models.activations import swiglu

    from engine import fused_gemv

    calls: list[tuple[str, int]] = []

    def norm_project(x, g, eps, w):
        calls.append(("norm_project", x.shape[0]))
        return mx.fast.rms_norm(x, g, eps) @ w.T

    def norm_swiglu(x, g, eps, w):
        calls.append(("norm_swiglu", x.shape[0]))
        return swiglu(*mx.split(mx.fast.rms_norm(x, g, eps) @ w.T, 2, axis=-1))

    def project_add(x, w, h):
        calls.append(("project_add", x.shape[0]))
        return h + x @ w.T

    monkeypatch.setattr(fused_gemv, "enabled", lambda: True)
    monkeypatch.setattr(fused_gemv, "available", lambda dtype, hidden, inter, rows: rows <= fused_gemv.MAX_ROWS)
    for fn in (norm_project, norm_swiglu, project_add):
        monkeypatch.setattr(fused_gemv, fn.__name__, fn)
    return calls


@pytest.fixture(scope="session")
def sentencepiece_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tiny SentencePiece tokenizer.model (BPE, byte fallback) and no tokenizer.json, loaded by mlx-lm: it gets
    the generic NaiveStreamingDetokenizer. "▁hello" and "▁world" are pieces; any other byte ("😀"'s, "é"'s, a lone
    " ") a byte piece "<0xNN>". Skips without the sentencepiece package."""
    spm = pytest.importorskip("sentencepiece")
    from mlx_lm.tokenizer_utils import load

    path = tmp_path_factory.mktemp("sentencepiece")
    lines = [" ".join(["hello world", "how are you", "world hello"][(i + j) % 3] for j in range(4)) for i in range(60)]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(path / "tokenizer"), vocab_size=300, model_type="bpe",
        byte_fallback=True, bos_id=1, eos_id=2, unk_id=0, pad_id=-1, add_dummy_prefix=True,
        normalization_rule_name="identity", minloglevel=2)
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "legacy": False, "add_bos_token": True, "bos_token": "<s>",
        "eos_token": "</s>", "unk_token": "<unk>", "clean_up_tokenization_spaces": False}))
    return load(path)
