"""A random-init Llama-3.2-1B-shape checkpoint (bf16) in the HF layout, twice: plain and with Llama 3.2's
`rope_scaling` block, sharing one weights file. For a host that gets no model files (the H200). `--shape 3b` / `8b`
build Llama-3.2-3B's and Llama-3.1-8B's shapes instead (3,072 and 4,096 wide: the widths the fused kernels' bound
in engine/fused_gemv.py is to be measured at).

Llama-3.2-1B has vocab 128256; the only tokenizer we can carry is the demo SmolLM2 one (49152 entries), so
the embedding (tied, as in Llama-3.2-1B) has 49152 rows: 2.1 GB of bf16 weights instead of 2.5 GB.

    python3 -m bench.gpu.build_shape --tokenizer .gpu/tok --out /tmp/shape   # → /tmp/shape/{plain,rope}
    python3 -m bench.gpu.build_shape --tokenizer .gpu/tok --out /tmp/shape-8b --shape 8b
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["LLAMA_32_1B", "LLAMA3_ROPE_SCALING", "SHAPES", "build", "main"]

LLAMA_32_1B: dict[str, Any] = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                                   num_key_value_heads=8, intermediate_size=8192, head_dim=64, rms_norm_eps=1e-5,
                                   rope_theta=500000.0, tie_word_embeddings=True)
LLAMA3_ROPE_SCALING = {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                       "original_max_position_embeddings": 8192, "rope_type": "llama3"}
# The larger public checkpoints' configs (their head_dim 128; 8B's embedding untied and its rope factor 8).
SHAPES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "1b": (LLAMA_32_1B, LLAMA3_ROPE_SCALING),
    "3b": (LLAMA_32_1B | dict(hidden_size=3072, num_hidden_layers=28, num_attention_heads=24, head_dim=128),
           LLAMA3_ROPE_SCALING),
    "8b": (LLAMA_32_1B | dict(hidden_size=4096, num_hidden_layers=32, intermediate_size=14336, head_dim=128,
                              tie_word_embeddings=False), LLAMA3_ROPE_SCALING | {"factor": 8.0}),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _special_ids(tokenizer_dir: Path) -> tuple[int, dict[str, int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    ids = {}
    for key in ("bos_token", "eos_token"):
        token = config.get(key)
        if isinstance(token, dict):
            token = token.get("content")
        if token and tok.token_to_id(token) is not None:
            ids[f"{key}_id"] = tok.token_to_id(token)
    return tok.get_vocab_size(with_added_tokens=True), ids


# Same layout at a toy size: for running bench/gpu/serve_h200.sh end to end on a CPU before spending GPU time.
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
            head_dim=16)


def build(tokenizer_dir: Path, out: Path, dtype: str = "bfloat16", seed: int = 0, tiny: bool = False,
          shape: str = "1b") -> dict[str, Path]:
    """Write out/plain and out/rope (config.json, tokenizer files, model.safetensors shared by a link).

    Raises FileNotFoundError when a tokenizer file is missing.
    """
    import mlx.core as mx
    from mlx_lm.models import llama

    for name in TOKENIZER_FILES:
        if not (tokenizer_dir / name).is_file():
            raise FileNotFoundError(f"{tokenizer_dir / name} missing (write it with bench/gpu/export_tokenizer.py)")
    vocab, special = _special_ids(tokenizer_dir)
    dims, rope_scaling = SHAPES[shape]
    base = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **dims, **(TINY if tiny else {}),
            "vocab_size": vocab, "torch_dtype": dtype, **special}
    configs = {
        "plain": base | {"max_position_embeddings": 8192},
        "rope": base | {"max_position_embeddings": 131072, "rope_scaling": dict(rope_scaling)},
    }
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(configs["plain"]))
    model.set_dtype(getattr(mx, dtype))
    from mlx.utils import tree_flatten

    weights = dict(tree_flatten(model.parameters()))
    dirs = {}
    for name, config in configs.items():
        d = out / name
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(config, indent=2))
        for f in TOKENIZER_FILES:
            shutil.copy(tokenizer_dir / f, d / f)
        dirs[name] = d
    mx.save_safetensors(str(dirs["plain"] / "model.safetensors"), weights, metadata={"format": "mlx"})
    (dirs["rope"] / "model.safetensors").symlink_to(dirs["plain"] / "model.safetensors")
    return dirs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", type=Path, required=True, help="dir with " + ", ".join(TOKENIZER_FILES))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--tiny", action="store_true", help="toy size, to check the scripts on a CPU")
    p.add_argument("--shape", choices=sorted(SHAPES), default="1b", help="which public checkpoint's shape")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    dirs = build(a.tokenizer, a.out, a.dtype, tiny=a.tiny, shape=a.shape)
    size = (dirs["plain"] / "model.safetensors").stat().st_size
    print(f"built {', '.join(str(d) for d in dirs.values())}: {size / 1e9:.2f} GB {a.dtype}, "
          f"{time.perf_counter() - t0:.1f} s ({'TINY test size' if a.tiny else a.shape + ' Llama shape'}, vocab of the "
          "SmolLM2 tokenizer)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
