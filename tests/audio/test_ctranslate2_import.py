"""audio/ctranslate2_import.py: a synthetic CTranslate2 model.bin round-trips into mlx-whisper's layout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from audio.ctranslate2_import import (
    CheckpointFormatError,
    import_ct2_whisper,
    read_ct2_model_bin,
    write_ct2_model_bin,
)
from tests.fixtures.tiny_whisper import TINY_WHISPER_DIMS, tiny_whisper_weights
from tests.fixtures.stop_flags import StopAfter


def _to_ct2(w: dict[str, np.ndarray], dims: dict[str, int]) -> dict[str, np.ndarray]:
    """The inverse mapping, written independently: fused QKV (zero key bias), fused cross KV, conv (out,in,k)."""
    v: dict[str, np.ndarray] = {}

    def norm(dst: str, src: str) -> None:
        v[f"{dst}/gamma"], v[f"{dst}/beta"] = w[f"{src}.weight"], w[f"{src}.bias"]

    def lin(dst: str, src: str) -> None:
        v[f"{dst}/weight"], v[f"{dst}/bias"] = w[f"{src}.weight"], w[f"{src}.bias"]

    def fused(dst: str, src: str, names: tuple[str, ...]) -> None:
        v[f"{dst}/weight"] = np.concatenate([w[f"{src}.{n}.weight"] for n in names])
        v[f"{dst}/bias"] = np.concatenate([w.get(f"{src}.{n}.bias", np.zeros(w[f"{src}.{n}.weight"].shape[0], np.float32))
                                           for n in names])

    for i in (1, 2):
        v[f"encoder/conv{i}/weight"] = w[f"encoder.conv{i}.weight"].transpose(0, 2, 1).astype(np.float16)
        v[f"encoder/conv{i}/bias"] = w[f"encoder.conv{i}.bias"]
    v["encoder/num_heads"] = np.array(dims["n_audio_head"], np.int16)
    v["encoder/position_encodings/encodings"] = np.zeros((dims["n_audio_ctx"], dims["n_audio_state"]), np.float32)
    for i in range(dims["n_audio_layer"]):
        s, d = f"encoder.blocks.{i}", f"encoder/layer_{i}"
        norm(f"{d}/self_attention/layer_norm", f"{s}.attn_ln")
        fused(f"{d}/self_attention/linear_0", f"{s}.attn", ("query", "key", "value"))
        lin(f"{d}/self_attention/linear_1", f"{s}.attn.out")
        norm(f"{d}/ffn/layer_norm", f"{s}.mlp_ln")
        lin(f"{d}/ffn/linear_0", f"{s}.mlp1")
        lin(f"{d}/ffn/linear_1", f"{s}.mlp2")
    norm("encoder/layer_norm", "encoder.ln_post")
    v["decoder/num_heads"] = np.array(dims["n_text_head"], np.int16)
    v["decoder/embeddings/weight"] = w["decoder.token_embedding.weight"]
    v["decoder/position_encodings/encodings"] = w["decoder.positional_embedding"]
    for i in range(dims["n_text_layer"]):
        s, d = f"decoder.blocks.{i}", f"decoder/layer_{i}"
        norm(f"{d}/self_attention/layer_norm", f"{s}.attn_ln")
        fused(f"{d}/self_attention/linear_0", f"{s}.attn", ("query", "key", "value"))
        lin(f"{d}/self_attention/linear_1", f"{s}.attn.out")
        norm(f"{d}/attention/layer_norm", f"{s}.cross_attn_ln")
        lin(f"{d}/attention/linear_0", f"{s}.cross_attn.query")
        fused(f"{d}/attention/linear_1", f"{s}.cross_attn", ("key", "value"))
        lin(f"{d}/attention/linear_2", f"{s}.cross_attn.out")
        norm(f"{d}/ffn/layer_norm", f"{s}.mlp_ln")
        lin(f"{d}/ffn/linear_0", f"{s}.mlp1")
        lin(f"{d}/ffn/linear_1", f"{s}.mlp2")
    norm("decoder/layer_norm", "decoder.ln")
    return v


@pytest.fixture(scope="module")
def ct2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("ct2")
    weights = tiny_whisper_weights()
    variables = _to_ct2(weights, TINY_WHISPER_DIMS)
    del variables["decoder/embeddings/weight"]  # stored once, reached through an alias as in real files
    variables["decoder/embeddings/weight_store"] = weights["decoder.token_embedding.weight"]
    write_ct2_model_bin(d / "model.bin", "WhisperSpec", variables,
                        aliases={"decoder/embeddings/weight": "decoder/embeddings/weight_store"})
    (d / "config.json").write_text(json.dumps({"alignment_heads": [[1, 0], [1, 1]]}))
    return d


def test_reader_resolves_aliases(ct2_dir: Path) -> None:
    spec, v = read_ct2_model_bin(ct2_dir / "model.bin")
    assert spec == "WhisperSpec"
    assert v["decoder/embeddings/weight"].shape == (TINY_WHISPER_DIMS["n_vocab"], TINY_WHISPER_DIMS["n_text_state"])
    assert v["encoder/conv1/weight"].dtype == np.float16


def test_import_round_trip(ct2_dir: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    out = import_ct2_whisper(ct2_dir, tmp_path / "mlx")
    config = json.loads((out / "config.json").read_text())
    assert {k: config[k] for k in TINY_WHISPER_DIMS} == TINY_WHISPER_DIMS
    assert json.loads((out / "alignment_heads.json").read_text()) == [[1, 0], [1, 1]]
    got, want = load_file(str(out / "weights.safetensors")), tiny_whisper_weights()
    assert set(got) == set(want)
    for name, w in want.items():
        tol = 1e-3 if "conv" in name and name.endswith("weight") else 0  # convs went through fp16
        np.testing.assert_allclose(got[name], w, atol=tol, err_msg=name)
        assert got[name].dtype == np.float32


def test_imported_checkpoint_loads_through_the_real_loader(ct2_dir: Path, tmp_path: Path) -> None:
    from audio.whisper import load_whisper

    loaded = load_whisper(import_ct2_whisper(ct2_dir, tmp_path / "mlx"), dtype="float32")
    assert loaded.model.dims.n_text_layer == TINY_WHISPER_DIMS["n_text_layer"]
    assert loaded.model.alignment_heads.tolist() == [[1, 0], [1, 1]]


def test_not_a_model_bin(tmp_path: Path) -> None:
    (tmp_path / "model.bin").write_bytes(b"\x05\x00\x00\x00garbage")
    with pytest.raises(CheckpointFormatError):
        import_ct2_whisper(tmp_path, tmp_path / "out")
    with pytest.raises(FileNotFoundError):
        import_ct2_whisper(tmp_path / "nowhere", tmp_path / "out2")


def test_missing_variable(tmp_path: Path) -> None:
    write_ct2_model_bin(tmp_path / "model.bin", "WhisperSpec", {"encoder/num_heads": np.array(2, np.int16)})
    with pytest.raises(CheckpointFormatError, match="lacks variable"):
        import_ct2_whisper(tmp_path, tmp_path / "out")


def _quantized(v: dict[str, np.ndarray], kind: str) -> dict[str, np.ndarray]:
    """`v` as `ct2-transformers-converter --quantization int8|int16` writes it (CTranslate2's LayerSpec._quantize):
    linear and embedding weights as integers times a float32 weight_scale, everything else untouched."""
    q: dict[str, np.ndarray] = {}
    for name, arr in v.items():
        if not (name.endswith("/weight") and ("linear_" in name or name == "decoder/embeddings/weight")):
            q[name] = arr
            continue
        w = arr.astype(np.float32)
        if kind == "int16":  # one scale: 10 bits for the largest value
            scale = np.float32(2**10 / np.abs(w).max())
            q[name] = np.clip(np.rint(w * scale), -32768, 32767).astype(np.int16)
            q[f"{name}_scale"] = np.array(scale, np.float32)
        else:  # one scale per output row
            amax = np.abs(w).max(axis=1)
            amax[amax == 0] = 127.0
            row_scale = (127.0 / amax).astype(np.float32)
            q[name] = np.rint(w * row_scale[:, None]).astype(np.int8)
            q[f"{name}_scale"] = row_scale
    return q


@pytest.mark.parametrize("kind", ["int8", "int16"])
def test_quantized_weights_import_dequantized(kind: str, tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    want = tiny_whisper_weights()
    variables = _quantized(_to_ct2(want, TINY_WHISPER_DIMS), kind)
    assert variables["decoder/layer_0/ffn/linear_0/weight"].dtype == np.dtype(kind)  # the file holds integers
    # as in real files: the output projection is an alias of the embeddings, quantized before it was aliased
    write_ct2_model_bin(tmp_path / "model.bin", "WhisperSpec", variables,
                        aliases={"decoder/projection/weight": "decoder/embeddings/weight"})
    got = load_file(str(import_ct2_whisper(tmp_path, tmp_path / "mlx") / "weights.safetensors"))
    assert set(got) == set(want)
    largest = max(float(np.abs(w).max()) for w in want.values())
    for name, w in want.items():
        if name.endswith("weight") and ("blocks" in name or "token_embedding" in name) and w.ndim == 2:
            # within half a quantization step of each row (int8), or of the (fused) matrix (int16): at most the
            # step of the largest weight there is
            step = np.abs(w).max(axis=1, keepdims=True) / 127 if kind == "int8" else np.full((1, 1), largest / 2**10)
            assert np.all(np.abs(got[name] - w) <= step / 2 + 1e-7), name
        else:
            tol = 1e-3 if "conv" in name and name.endswith("weight") else 0  # convs went through fp16
            np.testing.assert_allclose(got[name], w, atol=tol, err_msg=name)


def test_integer_weights_without_a_scale_are_refused(tmp_path: Path) -> None:
    variables = _to_ct2(tiny_whisper_weights(), TINY_WHISPER_DIMS)
    variables["encoder/layer_0/ffn/linear_0/weight"] = np.ones((128, 32), np.int8)
    write_ct2_model_bin(tmp_path / "model.bin", "WhisperSpec", variables)
    with pytest.raises(CheckpointFormatError, match="encoder/layer_0/ffn/linear_0/weight.*weight_scale"):
        import_ct2_whisper(tmp_path, tmp_path / "out")


def test_zero_point_quantization_is_refused(tmp_path: Path) -> None:
    variables = _quantized(_to_ct2(tiny_whisper_weights(), TINY_WHISPER_DIMS), "int8")
    variables["decoder/layer_0/ffn/linear_0/weight_zero"] = np.zeros(128, np.float32)
    write_ct2_model_bin(tmp_path / "model.bin", "WhisperSpec", variables)
    with pytest.raises(CheckpointFormatError, match="AWQ"):
        import_ct2_whisper(tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("when", ["at once", "after two weights", "at its last look"])
def test_an_import_told_to_stop_gives_up_and_leaves_nothing(when: str, ct2_dir: Path, tmp_path: Path) -> None:
    # Ctrl-C during a first start's Whisper import: it ran to the end before the server stopped.
    from engine.load_stop import LoadStopped

    counting = StopAfter(10**9)  # how often a whole import looks (the last: its files written)
    import_ct2_whisper(ct2_dir, tmp_path / "counted" / "mlx", stop=counting)
    stop = StopAfter({"at once": 1, "after two weights": 3, "at its last look": counting.looks}[when])
    (tmp_path / "out").mkdir()
    with pytest.raises(LoadStopped, match="stopped while importing"):
        import_ct2_whisper(ct2_dir, tmp_path / "out" / "mlx", stop=stop)
    assert stop.looks == stop.checks and list((tmp_path / "out").iterdir()) == []  # no import, no .partial


@pytest.mark.parametrize("raised", [KeyboardInterrupt, OSError])
def test_an_import_cut_by_ctrl_c_or_the_disk_leaves_no_partial_folder(raised: type[BaseException], ct2_dir: Path,
                                                                      tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # `tandem models import` stopped by Ctrl-C left OUTPUT.partial/ with its config and half its weights.
    def cut(*args: object, **kwargs: object) -> None:
        raise raised()

    monkeypatch.setattr("safetensors.numpy.save_file", cut)  # imported where the import writes
    (tmp_path / "out").mkdir()
    with pytest.raises(raised):
        import_ct2_whisper(ct2_dir, tmp_path / "out" / "mlx")
    assert list((tmp_path / "out").iterdir()) == []
