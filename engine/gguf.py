"""Import a llama, qwen2 or qwen3 GGUF file as an mlx-lm model directory (config, weights, tokenizer).

Every tensor is read from the file's bytes (engine/gguf_header.py, engine/gguf_tensors.py): F32/F16/BF16 as they
are, Q4_0/Q4_1/Q8_0/Q4_K/Q5_K as MLX affine-quantized triples (weight, scales, biases; group 32) with the file's
codes, every other type as float16 from llama.cpp's own reference dequantization (the `gguf` package). The conversion writes config.json,
model.safetensors and the tokenizer files once into the user cache dir, keyed by the file's path, size and mtime,
so the next start loads a plain Hugging Face layout directory with `mlx_lm.utils.load`. A process that begins to
stop ends a conversion at its next tensor or file (engine/load_stop.py) and removes its staging folder. Each
conversion records its
source (engine/cache_entries.py), and writing one removes those it supersedes: of the same file changed in place or
read by an older format, or of a file that is gone (a reinstall, an upgrade, a deleted venv).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.backend import user_cache_dir
from engine.cache_entries import EntrySource, prune_superseded, read_source, record_source
from engine.cpu_weights import WeightSizes
from engine.file_modes import plain_modes
from engine.gguf_header import GGUFError, read_header
from engine.gguf_sizes import gguf_sizes
from engine.gguf_tensors import check_types, read_tensors
from engine.load_stop import Stoppable, check_stop

__all__ = ["GGUFError", "check_architecture", "convert_gguf", "gguf_config", "gguf_tokenizer", "gguf_weights", "read_gguf"]

# Bump when the written layout changes, so stale cache entries are never reused.
_FORMAT_VERSION = 2  # 2: K-quants kept as affine triples, types read by the gguf package
# llama.cpp architectures whose layers are mlx-lm's model of the same name. Only "llama" files carry Q/K rows
# permuted for llama.cpp's interleaved RoPE; qwen2/qwen3 keep Hugging Face's halves (llama.cpp's NEOX RoPE).
_SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",  # qwen3
    "attn_k_norm": "self_attn.k_norm",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_TOKENIZER_ROOM = 32 << 20  # beside the weights: tokenizer.json (~9 MB for a 128k vocabulary), config, headers
_TENSOR = re.compile(r"^(?:blk\.(\d+)\.)?([a-z_]+)\.(weight|scales|biases|bias)$")

_log = logging.getLogger(__name__)


def convert_gguf(path: str | os.PathLike[str], *, dequantize: bool = False, cache_root: Path | None = None,
                 stop: Stoppable | None = None) -> Path:
    """Return a cached HF-layout directory for the GGUF at `path`, converting it on first use.

    With `dequantize`, quantized tensors are written as float32 (a separate cache entry): the CPU backend
    runs float32 through BLAS, and dequantizing once on disk beats doing it at every start. `stop` (None: this
    process's, engine/load_stop.py) is read between tensors and files.

    Raises FileNotFoundError when `path` does not exist, GGUFError when the file is not a supported
    llama-family GGUF, OSError when the cache cannot be written or its disk lacks room for the conversion (said
    before anything is written), LoadStopped when `stop` is set before the
    conversion is whole (its staging folder removed).
    """
    source = Path(path).resolve()
    stat = source.stat()
    key = hashlib.sha256(f"{source}|{stat.st_size}|{stat.st_mtime_ns}|{_FORMAT_VERSION}".encode()).hexdigest()
    root = (cache_root or user_cache_dir()) / "gguf"
    target = root / f"{source.stem}-{key[:16]}{'-f32' if dequantize else ''}"
    made_from = EntrySource(str(source), key, (_FORMAT_VERSION,),
                            {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "dequantize": dequantize})
    if (target / "config.json").is_file():
        if read_source(target) is None:
            # Written before sidecars: the key, a hash of this very path, size and mtime, says this file made it.
            with contextlib.suppress(OSError):
                record_source(target, made_from)
        return target
    infos = read_header(source)[1]
    check_types(infos, source)  # before announcing a conversion of a file that is not one
    root.mkdir(parents=True, exist_ok=True)
    _check_room(root, source.name, gguf_sizes(infos), dequantize)
    # The first start writes the whole model again (float32 is several times the GGUF): say so, and where.
    _log.info("first use of %s: converting it%s into %s (once; later starts reuse it)", source.name,
              " to float32 for the CPU backend" if dequantize else "", target)
    started = time.perf_counter()
    staging = Path(tempfile.mkdtemp(dir=root, prefix=".convert-"))
    try:
        _write_model_dir(source, staging, dequantize, stop)
        check_stop(stop, f"converting {source.name}")
        record_source(staging, made_from)
        plain_modes(staging)  # mkdtemp's 0700: another user (a container's runtime user) could not read it
        try:
            staging.rename(target)
        except OSError:
            # Another process converted the same file first; its copy is as good as ours.
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    size = sum(f.stat().st_size for f in target.iterdir() if f.is_file())
    _log.info("converted %s in %.1f s (%.0f MB)", source.name, time.perf_counter() - started, size / 1e6)
    prune_superseded(_entries(root), target, made_from, staging_root=root, staging_prefix=".convert-")
    return target


def _check_room(root: Path, name: str, sizes: WeightSizes, dequantize: bool) -> None:
    """Raises OSError, in one line naming `root` and the bytes needed, when its disk has no room for the conversion:
    a full disk failed it mid-write, after minutes, with a bare [Errno 28]."""
    needed = (sizes.float32 if dequantize else sizes.stored) + _TOKENIZER_ROOM
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return  # not knowable here: the write says it
    if free < needed:
        form = "as float32" if dequantize else "its quantized tensors kept"
        raise OSError(f"converting {name} ({form}) needs {needed / 1e6:,.0f} MB in {root}, and its disk has "
                      f"{free / 1e6:,.0f} MB free: free some space, or set XDG_CACHE_HOME to a disk with room")


def _entries(root: Path) -> list[Path]:
    """The conversions under `root` (not the `.convert-*` staging folders). Raises nothing."""
    try:
        return [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []


def _write_model_dir(source: Path, out: Path, dequantize: bool, stop: Stoppable | None) -> None:
    import mlx.core as mx

    doing = f"converting {source.name}"
    metadata, infos = read_header(source)
    tensors = read_tensors(source, infos, doing, stop=stop)
    config = gguf_config(metadata, tensors)
    weights = gguf_weights(tensors)
    if dequantize:
        weights = _dequantized(weights, stop, doing)
    elif any(name.endswith(".scales") for name in weights):
        # Per-layer bits (e.g. Q8_0 embeddings beside Q4_K layers) are inferred by mlx-lm from the shapes.
        config["quantization"] = {"group_size": 32, "bits": _common_bits(weights)}
        # Float16 scales, as the model computes: a K-quant's product of two scales rounds here (~2e-4 relative).
        weights = {n: v.astype(mx.float16) if n.endswith((".scales", ".biases")) else v for n, v in weights.items()}
    check_stop(stop, doing)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    check_stop(stop, doing)
    gguf_tokenizer(metadata).save_pretrained(str(out))


def read_gguf(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Tensors (MLX arrays; affine types as triples with float32 scales) and metadata (plain Python values) of a
    GGUF file. Raises GGUFError when the file is not a whole GGUF or holds a type nothing here reads."""
    metadata, infos = read_header(path)
    return read_tensors(path, infos), metadata


def check_architecture(metadata: dict[str, Any]) -> str:
    """The GGUF's architecture, one the import maps onto mlx-lm's models. Raises GGUFError for another."""
    arch = metadata.get("general.architecture")
    if arch not in _SUPPORTED_ARCHITECTURES:
        raise GGUFError(f"GGUF architecture {arch!r} is not supported (supported: {', '.join(_SUPPORTED_ARCHITECTURES)})")
    return str(arch)


def gguf_config(metadata: dict[str, Any], tensors: dict[str, Any]) -> dict[str, Any]:
    """An mlx-lm config.json dict (llama, qwen2 or qwen3) built from GGUF metadata.

    Raises GGUFError for another architecture, missing hyperparameters or an unsupported RoPE scaling.
    """
    arch = check_architecture(metadata)

    def get(key: str, default: Any = KeyError) -> Any:
        value = metadata.get(f"{arch}.{key}", default)
        if value is KeyError:
            raise GGUFError(f"GGUF metadata lacks {arch}.{key}")
        return value

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    kv_heads = get("attention.head_count_kv", heads)
    if isinstance(kv_heads, list):
        raise GGUFError("GGUF with a per-layer KV head count is not supported")
    tokens = metadata.get("tokenizer.ggml.tokens") or []
    config: dict[str, Any] = {
        "model_type": arch,
        "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]],
        "hidden_size": hidden,
        "num_hidden_layers": int(get("block_count")),
        "intermediate_size": int(get("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(kv_heads),
        "head_dim": int(get("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        "vocab_size": int(get("vocab_size", len(tokens) or tensors["token_embd.weight"].shape[0])),
        "max_position_embeddings": int(get("context_length", 4096)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        # llama.cpp permutes a llama's Q/K rows for its interleaved RoPE, so the pairs are adjacent there.
        "rope_traditional": arch == "llama",
        "tie_word_embeddings": "output.weight" not in tensors,
    }
    scaling = get("rope.scaling.type", "none")
    if "rope_freqs.weight" in tensors:
        config["rope_scaling"] = _llama3_scaling(tensors["rope_freqs.weight"], config["head_dim"], config["rope_theta"])
    elif scaling == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": float(get("rope.scaling.factor"))}
    elif scaling not in ("none", None):
        raise GGUFError(f"GGUF RoPE scaling {scaling!r} is not supported")
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    if bos is not None:
        config["bos_token_id"] = int(bos)
    eos = _eos_ids(metadata)
    if eos:
        config["eos_token_id"] = eos if len(eos) > 1 else eos[0]
    return config


def _llama3_scaling(rope_freqs: Any, dims: int, base: float) -> dict[str, Any]:
    """Llama-3 RoPE parameters that reproduce llama.cpp's per-dimension factors exactly.

    llama.cpp stores factor f_i per frequency: 1 (high), `factor` (low), and 1/((1-s)/factor + s) between,
    where s = (L/wavelen - lo)/(hi - lo) is linear in 1/wavelen. Fitting that line recovers every (L, lo, hi)
    that gives the same factors; L is then free. Raises GGUFError when the factors do not have that shape.
    """
    import numpy as np

    factors = np.array(rope_freqs, dtype=np.float64)
    wavelens = 2 * np.pi * base ** (np.arange(0, dims, 2) / dims)
    factor = float(factors.max())
    if factors.shape != wavelens.shape or factor <= 1.0:
        raise GGUFError(f"unexpected rope_freqs tensor (shape {factors.shape}, max {factor})")
    medium = (factors > 1 + 1e-4) & (factors < factor * (1 - 1e-4))
    if medium.sum() < 2:
        raise GGUFError("rope_freqs has fewer than two smoothed frequencies; cannot recover llama-3 RoPE scaling")
    smooth = (1 / factors[medium] - 1 / factor) / (1 - 1 / factor)
    slope, intercept = np.polyfit(1 / wavelens[medium], smooth, 1)
    original = 8192.0  # any positive length works: only L/(hi-lo) and lo/(hi-lo) are fixed
    span = original / slope
    low = -intercept * span
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": float(low),
        "high_freq_factor": float(low + span),
        "original_max_position_embeddings": original,
    }


def _eos_ids(metadata: dict[str, Any]) -> list[int]:
    ids = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        value = metadata.get(f"tokenizer.ggml.{key}")
        if value is not None and int(value) not in ids:
            ids.append(int(value))
    return ids


def gguf_weights(tensors: dict[str, Any]) -> dict[str, Any]:
    """GGUF tensors renamed to mlx-lm parameter names (quantized triples kept as they are).

    Raises GGUFError for a tensor name outside the llama/qwen layout.
    """
    renamed = {}
    for name, value in tensors.items():
        if name == "rope_freqs.weight":  # folded into config["rope_scaling"]
            continue
        match = _TENSOR.match(name)
        if match is None:
            raise GGUFError(f"unexpected GGUF tensor {name!r}")
        layer, base, suffix = match.groups()
        table = _LAYER_NAMES if layer is not None else _GLOBAL_NAMES
        if base not in table:
            raise GGUFError(f"unexpected GGUF tensor {name!r}")
        prefix = f"model.layers.{layer}.{table[base]}" if layer is not None else table[base]
        renamed[f"{prefix}.{suffix}"] = value
    return renamed


def _dequantized(weights: dict[str, Any], stop: Stoppable | None = None, doing: str = "converting") -> dict[str, Any]:
    """Quantized triples replaced by float32 weights; other floating tensors cast to float32, each evaluated here
    (not inside the save), so `stop` is read between them. Raises LoadStopped once it is set."""
    import mlx.core as mx

    dense = {}
    for name, value in weights.items():
        if name.endswith((".scales", ".biases")):
            continue
        check_stop(stop, doing)
        scales = weights.get(name[: -len("weight")] + "scales") if name.endswith(".weight") else None
        if scales is not None:
            biases = weights[name[: -len("weight")] + "biases"]
            # float32 scales give a float32 result directly, without a float16 rounding step.
            value = mx.dequantize(
                value, scales.astype(mx.float32), biases.astype(mx.float32),
                group_size=32, bits=value.shape[-1] // scales.shape[-1],
            )
        dense[name] = value.astype(mx.float32) if mx.issubdtype(value.dtype, mx.floating) else value
        mx.eval(dense[name])
    return dense


def _common_bits(weights: dict[str, Any]) -> int:
    counts: dict[int, int] = {}
    for name, scales in weights.items():
        if name.endswith(".scales"):
            packed = weights[name[: -len("scales")] + "weight"]
            bits = packed.shape[-1] * 32 // (scales.shape[-1] * 32)
            counts[bits] = counts.get(bits, 0) + 1
    return max(counts, key=lambda bits: counts[bits])


def gguf_tokenizer(metadata: dict[str, Any]) -> Any:
    """A transformers fast tokenizer (with the chat template) built from GGUF tokenizer metadata.

    Uses transformers' GGUF tokenizer builders, which need only `tokenizers` (its GGUF loading path
    imports torch; these functions do not). Raises GGUFError for a tokenizer type they cannot build.
    """
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf import gguf_tokenizer_mapping as mapping

    fields = {
        name: metadata[f"tokenizer.{key}"]
        for key, name in mapping.GGUF_TOKENIZER_MAPPING["tokenizer"].items()
        if f"tokenizer.{key}" in metadata
    }
    if "tokens" not in fields:
        raise GGUFError("GGUF has no tokenizer (tokenizer.ggml.tokens)")
    arch = metadata.get("general.architecture", "llama")
    try:
        built = mapping.select_tokenizer_builder(arch, fields.get("tokenizer_type"))(fields)
    except ValueError as exc:
        raise GGUFError(str(exc)) from exc
    built = mapping.add_gguf_special_tokens(built, fields)
    built = mapping.set_split_regex(built, fields)
    backend = built.backend_tokenizer
    if fields.get("pre_tokenizer_type") == "smollm":
        # llama.cpp's "smollm" splits digits one by one before the GPT-2 regex, as SmolLM's tokenizer.json.
        from tokenizers import pre_tokenizers

        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    tokens = fields["tokens"]

    def token(key: str) -> str | None:
        value = metadata.get(f"tokenizer.ggml.{key}")
        return tokens[int(value)] if value is not None and 0 <= int(value) < len(tokens) else None

    bos = token("bos_token_id")
    # llama.cpp adds BOS to a sentencepiece vocabulary unless the file says otherwise.
    add_bos = metadata.get("tokenizer.ggml.add_bos_token", fields.get("tokenizer_type") == "llama")
    if add_bos and bos is not None:
        bos_id = int(metadata["tokenizer.ggml.bos_token_id"])
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token=token("eos_token_id"),
        unk_token=token("unknown_token_id"),
        pad_token=token("padding_token_id"),
        chat_template=metadata.get("tokenizer.chat_template"),
        clean_up_tokenization_spaces=False,
        model_max_length=int(metadata.get(f"{arch}.context_length", 4096)),
    )
