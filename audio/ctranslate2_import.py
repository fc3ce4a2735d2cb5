"""Import a faster-whisper (CTranslate2) Whisper checkpoint into mlx-whisper's layout.

model.bin v6: u32 version, str spec, u32 revision, u32 n_vars, then per variable: str name, u8 rank,
u32 dims[rank], u8 dtype, u32 nbytes, data; then u32 n_aliases, (str, str)*. Strings: u16 length
including the NUL. Output: config.json (ModelDimensions), weights.safetensors, alignment_heads.json.

Quantized checkpoints (`--quantization int8*` / `int16`) store a layer's `weight` as integers beside a float32
`weight_scale`: CTranslate2's weight is `weight / weight_scale` (int8: one scale per output row; int16: one
scale for the whole matrix). The import dequantizes them to floats; other quantizations are refused.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np

from engine.file_modes import plain_modes
from engine.load_stop import LoadStopped, Stoppable, check_stop
from engine.progress import progress

__all__ = ["CheckpointFormatError", "read_ct2_model_bin", "write_ct2_model_bin", "dequantize", "ct2_to_mlx_weights",
           "import_ct2_whisper", "is_ct2_whisper_dir", "FORMAT_VERSION"]

# What an import holds for a given model.bin; part of the import cache's key (audio/whisper_imports.py), so an
# import written by an older importer is never reused. 2: int8/int16 weights divided by their weight_scale
# (1 kept them as raw integers: such an import transcribed garbage).
FORMAT_VERSION = 2

_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
_BF16 = 5


class CheckpointFormatError(ValueError):
    """The directory or file is not a CTranslate2 Whisper checkpoint this importer understands."""


def _read_str(f: BinaryIO) -> str:
    (n,) = struct.unpack("<H", f.read(2))
    return f.read(n)[:-1].decode("utf-8")


def _write_str(f: BinaryIO, s: str) -> None:
    b = s.encode("utf-8") + b"\0"
    f.write(struct.pack("<H", len(b)) + b)


def read_ct2_model_bin(path: str | Path) -> tuple[str, dict[str, np.ndarray]]:
    """(spec name, variables with aliases resolved). Raises CheckpointFormatError for anything else."""
    variables: dict[str, np.ndarray] = {}
    with open(path, "rb") as f:
        try:
            (version,) = struct.unpack("<I", f.read(4))
            if version != 6:
                raise CheckpointFormatError(f"{path}: CTranslate2 model.bin version {version}, expected 6")
            spec = _read_str(f)
            f.read(4)  # spec revision
            (count,) = struct.unpack("<I", f.read(4))
            for _ in range(count):
                name = _read_str(f)
                (rank,) = struct.unpack("<B", f.read(1))
                dims = struct.unpack(f"<{rank}I", f.read(4 * rank)) if rank else ()
                (dtype,) = struct.unpack("<B", f.read(1))
                (nbytes,) = struct.unpack("<I", f.read(4))
                raw = f.read(nbytes)
                if len(raw) != nbytes:
                    raise CheckpointFormatError(f"{path}: truncated at variable {name!r}")
                if dtype == _BF16:  # widen bf16 to f32 by shifting into the high half
                    arr = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
                elif dtype in _DTYPES:
                    arr = np.frombuffer(raw, _DTYPES[dtype])
                else:
                    raise CheckpointFormatError(f"{path}: variable {name!r} has unknown dtype {dtype}")
                variables[name] = arr.reshape(dims)
            (n_alias,) = struct.unpack("<I", f.read(4))
            for _ in range(n_alias):
                alias, target = _read_str(f), _read_str(f)
                variables[alias] = variables[target]
                # Aliases are made before quantizing, so an alias of a quantized weight has no scale of its own.
                if f"{target}_scale" in variables:
                    variables.setdefault(f"{alias}_scale", variables[f"{target}_scale"])
        except (struct.error, UnicodeDecodeError) as exc:
            raise CheckpointFormatError(f"{path}: not a CTranslate2 model.bin ({exc})") from None
    return spec, variables


def write_ct2_model_bin(path: str | Path, spec: str, variables: dict[str, np.ndarray],
                        aliases: dict[str, str] | None = None) -> None:
    """Write a model.bin v6 (tests build synthetic checkpoints with this). Raises ValueError for a dtype
    CTranslate2 has no code for."""
    codes = {np.dtype(v): k for k, v in _DTYPES.items()}
    with open(path, "wb") as f:
        f.write(struct.pack("<I", 6))
        _write_str(f, spec)
        f.write(struct.pack("<II", 1, len(variables)))
        for name, arr in variables.items():
            arr = np.ascontiguousarray(arr)
            if arr.dtype not in codes:
                raise ValueError(f"{name}: dtype {arr.dtype} has no CTranslate2 code")
            _write_str(f, name)
            f.write(struct.pack("<B", arr.ndim) + struct.pack(f"<{arr.ndim}I", *arr.shape))
            f.write(struct.pack("<BI", codes[arr.dtype], arr.nbytes) + arr.tobytes())
        f.write(struct.pack("<I", len(aliases or {})))
        for alias, target in (aliases or {}).items():
            _write_str(f, alias)
            _write_str(f, target)


def dequantize(v: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`v` with every integer `…/weight` divided by its `…/weight_scale` (float32) and the scales dropped; float
    variables as they are. Raises CheckpointFormatError for a quantization this cannot read back: an integer
    weight without a scale, a scale of another shape than CTranslate2's int8 (per row) or int16 (one) scales,
    or zero points (AWQ)."""
    out: dict[str, np.ndarray] = {}
    for name, arr in v.items():
        if name.endswith("/weight_zero"):
            raise CheckpointFormatError(f"{name}: zero-point (AWQ) quantized CTranslate2 weights are not "
                                        "supported; convert the model with --quantization int8, float16 or float32")
        if name.endswith("/weight_scale"):
            continue
        scale = v.get(f"{name}_scale") if name.endswith("/weight") else None
        if scale is None:
            if name.endswith("/weight") and arr.ndim >= 2 and not np.issubdtype(arr.dtype, np.floating):
                raise CheckpointFormatError(f"{name}: {arr.dtype} weights without a weight_scale; this is no "
                                            "CTranslate2 quantization the importer knows")
            out[name] = arr
            continue
        if arr.dtype not in (np.int8, np.int16):
            raise CheckpointFormatError(f"{name}: a weight_scale beside {arr.dtype} weights (expected int8 or int16)")
        if scale.size == 1:  # int16: one scale for the matrix
            divisor = scale.astype(np.float32).reshape(())
        elif scale.shape == arr.shape[:1]:  # int8: one scale per output row
            divisor = scale.astype(np.float32).reshape((-1,) + (1,) * (arr.ndim - 1))
        else:
            raise CheckpointFormatError(f"{name}: weight_scale of shape {scale.shape} does not fit weights of "
                                        f"shape {arr.shape}")
        out[name] = arr.astype(np.float32) / divisor
    return out


def _layers(v: dict[str, np.ndarray], prefix: str) -> int:
    pat = re.compile(rf"^{prefix}/layer_(\d+)/")
    return 1 + max((int(m.group(1)) for k in v if (m := pat.match(k))), default=-1)


def _linear(out: dict[str, np.ndarray], v: dict[str, np.ndarray], src: str, dst: str, bias: bool = True) -> None:
    out[f"{dst}.weight"] = v[f"{src}/weight"]
    if bias:
        out[f"{dst}.bias"] = v[f"{src}/bias"]


def _norm(out: dict[str, np.ndarray], v: dict[str, np.ndarray], src: str, dst: str) -> None:
    out[f"{dst}.weight"], out[f"{dst}.bias"] = v[f"{src}/gamma"], v[f"{src}/beta"]


def _split_qkv(out: dict[str, np.ndarray], v: dict[str, np.ndarray], src: str, dst: str, names: tuple[str, ...]) -> None:
    # CTranslate2 fuses projections along the output axis; Whisper's key projection has no bias.
    ws = np.split(v[f"{src}/weight"], len(names), axis=0)
    bs = np.split(v[f"{src}/bias"], len(names), axis=0)
    for name, w, b in zip(names, ws, bs):
        out[f"{dst}.{name}.weight"] = w
        if name != "key":
            out[f"{dst}.{name}.bias"] = b


def _block(out: dict[str, np.ndarray], v: dict[str, np.ndarray], src: str, dst: str) -> None:
    """Self-attention (fused QKV) and FFN of one encoder or decoder layer; cross-attention is the caller's."""
    _norm(out, v, f"{src}/self_attention/layer_norm", f"{dst}.attn_ln")
    _split_qkv(out, v, f"{src}/self_attention/linear_0", f"{dst}.attn", ("query", "key", "value"))
    _linear(out, v, f"{src}/self_attention/linear_1", f"{dst}.attn.out")
    _norm(out, v, f"{src}/ffn/layer_norm", f"{dst}.mlp_ln")
    _linear(out, v, f"{src}/ffn/linear_0", f"{dst}.mlp1")
    _linear(out, v, f"{src}/ffn/linear_1", f"{dst}.mlp2")


def ct2_to_mlx_weights(v: dict[str, np.ndarray]) -> tuple[dict[str, int], dict[str, np.ndarray]]:
    """(ModelDimensions dict, mlx-whisper weight dict) from CTranslate2 WhisperSpec variables.
    Quantized weights come out dequantized (float32). Raises CheckpointFormatError when a required variable is
    missing or a quantization cannot be read back (see dequantize)."""
    v = dequantize(v)
    try:
        n_enc, n_dec = _layers(v, "encoder"), _layers(v, "decoder")
        embed = v["decoder/embeddings/weight"]
        dims = {
            "n_mels": int(v["encoder/conv1/weight"].shape[1]),
            "n_audio_ctx": int(v["encoder/position_encodings/encodings"].shape[0]),
            "n_audio_state": int(v["encoder/conv1/weight"].shape[0]),
            "n_audio_head": int(v["encoder/num_heads"].reshape(-1)[0]),
            "n_audio_layer": n_enc,
            "n_vocab": int(embed.shape[0]),
            "n_text_ctx": int(v["decoder/position_encodings/encodings"].shape[0]),
            "n_text_state": int(embed.shape[1]),
            "n_text_head": int(v["decoder/num_heads"].reshape(-1)[0]),
            "n_text_layer": n_dec,
        }
        out: dict[str, np.ndarray] = {}
        for i in (1, 2):  # conv: (out, in, k) → MLX's (out, k, in)
            out[f"encoder.conv{i}.weight"] = v[f"encoder/conv{i}/weight"].transpose(0, 2, 1)
            out[f"encoder.conv{i}.bias"] = v[f"encoder/conv{i}/bias"]
        for i in range(n_enc):
            _block(out, v, f"encoder/layer_{i}", f"encoder.blocks.{i}")
        _norm(out, v, "encoder/layer_norm", "encoder.ln_post")
        out["decoder.token_embedding.weight"] = embed
        out["decoder.positional_embedding"] = v["decoder/position_encodings/encodings"]
        for i in range(n_dec):
            s, d = f"decoder/layer_{i}", f"decoder.blocks.{i}"
            _block(out, v, s, d)
            _norm(out, v, f"{s}/attention/layer_norm", f"{d}.cross_attn_ln")
            _linear(out, v, f"{s}/attention/linear_0", f"{d}.cross_attn.query")
            _split_qkv(out, v, f"{s}/attention/linear_1", f"{d}.cross_attn", ("key", "value"))
            _linear(out, v, f"{s}/attention/linear_2", f"{d}.cross_attn.out")
        _norm(out, v, "decoder/layer_norm", "decoder.ln")
    except KeyError as exc:
        raise CheckpointFormatError(f"CTranslate2 Whisper checkpoint lacks variable {exc}") from None
    return dims, out


def is_ct2_whisper_dir(path: str | Path) -> bool:
    """A directory holding a CTranslate2 model.bin (and no MLX config/weights). Raises nothing."""
    p = Path(path)
    return (p / "model.bin").is_file() and not (p / "weights.safetensors").is_file()


def import_ct2_whisper(src: str | Path, dst: str | Path, dtype: str = "float32", *,
                       stop: Stoppable | None = None) -> Path:
    """Convert CT2 dir `src` into an mlx-whisper dir `dst` (float32 or float16 weights). Writes into a
    temporary sibling and renames, so a half-written dir never exists. `stop` (None: this process's,
    engine/load_stop.py) is read between weights and files. Raises CheckpointFormatError, FileNotFoundError,
    LoadStopped once `stop` is set (the temporary sibling removed)."""
    from safetensors.numpy import save_file

    src, dst = Path(src), Path(dst)
    if not (src / "model.bin").is_file():
        raise FileNotFoundError(f"{src} has no model.bin (not a CTranslate2 checkpoint)")
    spec, variables = read_ct2_model_bin(src / "model.bin")
    if "whisper" not in spec.lower():
        raise CheckpointFormatError(f"{src}: model.bin holds a {spec}, not a WhisperSpec")
    dims, weights = ct2_to_mlx_weights(variables)
    np_dtype = {"float32": np.float32, "float16": np.float16}[dtype]
    doing = f"importing {src.name}"

    def converted(weight: np.ndarray) -> np.ndarray:
        check_stop(stop, doing)
        return np.ascontiguousarray(weight.astype(np_dtype))

    weights = {k: converted(w) for k, w in progress(weights.items(), doing, total=len(weights))}
    heads: list[list[int]] | None = None
    config_path = src / "config.json"
    if config_path.is_file():
        heads = json.loads(config_path.read_text()).get("alignment_heads")
    tmp = dst.with_name(dst.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        (tmp / "config.json").write_text(json.dumps({"model_type": "whisper", **dims}, indent=2))
        save_file(weights, str(tmp / "weights.safetensors"))
        check_stop(stop, doing)
        if heads:
            (tmp / "alignment_heads.json").write_text(json.dumps(heads))
    except (LoadStopped, KeyboardInterrupt, OSError):  # a Ctrl-C or a full disk too: no half-written import stays
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    plain_modes(tmp)  # safetensors writes through a private 0600 file: readable by other users as a plain write is
    if dst.exists():
        shutil.rmtree(dst)
    tmp.rename(dst)
    return dst
