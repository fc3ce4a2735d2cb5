"""engine.models: resolving a spec (local dir, GGUF, HF cache, demo) and loading it, float32 on the CPU."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import engine  # noqa: F401  (fast BLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from engine import models
from engine.models import ModelNotFound, hf_dir_for, load_model, resolve_model


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return cache


def put_in_hub_cache(cache: Path, repo_id: str, files: Path, revision: str = "0123abcd" * 5) -> Path:
    """Lay `files` out as huggingface_hub does: blobs by hash, snapshot symlinks, refs/main."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for file in files.iterdir():
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return snapshot


def _logits(model: nn.Module, ids: list[int]) -> np.ndarray:
    return np.array(model(mx.array([ids]))[0].astype(mx.float32))


def _greedy(loaded, prompt: str, n: int = 8) -> list[int]:
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    ids = mx.array(loaded.tokenizer.encode(prompt))
    steps = generate_step(ids, loaded.model, max_tokens=n, sampler=make_sampler(0.0))
    return [int(token) for token, _ in steps]


def test_local_dir_loads_like_mlx_lm(tiny_llm_dir) -> None:
    from mlx_lm.utils import load

    loaded = load_model(str(tiny_llm_dir))
    assert loaded.name == tiny_llm_dir.name
    assert (loaded.kind, loaded.source, loaded.context_length) == ("hf_dir", str(tiny_llm_dir), 2048)
    assert loaded.root == str(tiny_llm_dir)  # vLLM's /v1/models `root`: a path served is its path
    assert loaded.float32 is (mx.default_device() == mx.cpu)
    assert loaded.tokenizer.has_chat_template
    model, tokenizer = load(str(tiny_llm_dir))
    ids = tokenizer.encode("The quick brown fox")
    np.testing.assert_allclose(_logits(loaded.model, ids), _logits(model, ids), atol=1e-5)


def test_repo_id_resolves_from_the_hub_cache_offline(tiny_llm_dir, hub_cache, monkeypatch) -> None:
    snapshot = put_in_hub_cache(hub_cache, "tiny-org/tiny-llm", tiny_llm_dir)

    def no_network(*args, **kwargs):
        raise AssertionError("resolve/load must not call the hub")

    monkeypatch.setattr("huggingface_hub.snapshot_download", no_network)
    monkeypatch.setattr("mlx_lm.utils.snapshot_download", no_network)
    source = resolve_model("tiny-org/tiny-llm")
    assert (source.kind, source.path, source.repo, source.name) == ("hf_dir", snapshot, "tiny-org/tiny-llm", "tiny-org/tiny-llm")
    loaded = load_model("tiny-org/tiny-llm")
    assert loaded.name == loaded.root == "tiny-org/tiny-llm"  # a repo id served is its root, as vLLM's
    assert _greedy(loaded, "Hello world") == _greedy(load_model(str(tiny_llm_dir)), "Hello world")


def test_unknown_model_says_how_to_get_one(hub_cache) -> None:
    with pytest.raises(ModelNotFound) as caught:
        resolve_model("nobody/nothing")
    message = str(caught.value)
    assert "tandem models get nobody/nothing" in message
    assert "local" in message and "demo extra" in message


def test_no_model_named_without_demo_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setattr(models, "demo_model_path", lambda: None)
    with pytest.raises(ModelNotFound, match="demo weights are not installed.*tandem models get"):
        load_model(None)


def test_no_model_named_uses_the_demo_gguf(monkeypatch, tmp_path) -> None:
    fake = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    fake.write_bytes(b"GGUF")
    monkeypatch.setattr(models, "demo_model_path", lambda: fake)
    assert resolve_model(None) == models.ModelSource("SmolLM2-135M-Instruct", "gguf", fake)
    assert resolve_model("demo") == resolve_model(None)
    assert resolve_model("SmolLM2-135M-Instruct") == resolve_model(None)  # the id /v1/models shows


def test_local_gguf_and_dir_without_config(tmp_path) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "m.Q8_0.gguf").write_bytes(b"GGUF")
    assert resolve_model(str(tmp_path / "one")).kind == "gguf"
    (tmp_path / "one" / "n.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelNotFound, match="2 .gguf files"):
        resolve_model(str(tmp_path / "one"))
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ModelNotFound, match="not a .gguf"):
        resolve_model(str(tmp_path / "notes.txt"))


def test_bf16_weights_become_float32_on_cpu(tiny_llm_dir, tmp_path) -> None:
    bf16 = tmp_path / "bf16"
    shutil.copytree(tiny_llm_dir, bf16)
    weights = mx.load(str(bf16 / "model.safetensors"))
    mx.save_safetensors(str(bf16 / "model.safetensors"), {k: v.astype(mx.bfloat16) for k, v in weights.items()})

    loaded = load_model(str(bf16), float32=True)
    assert {p.dtype for _, p in tree_flatten(loaded.model.parameters())} == {mx.float32}
    kept = load_model(str(bf16), float32=False)
    assert {p.dtype for _, p in tree_flatten(kept.model.parameters())} == {mx.bfloat16}
    cast = dict(tree_flatten(loaded.model.parameters()))
    for name, value in tree_flatten(kept.model.parameters()):
        assert mx.array_equal(cast[name], value.astype(mx.float32)), name


# mlx-lm's affine modes and a microscaling one (mxfp4, as mlx-community's gpt-oss checkpoints carry: its scales are
# uint8 exponents, which the dequantization refused as float32 — "could not load model").
@pytest.mark.parametrize("mode,bits", [("affine", 8), ("mxfp4", 4)])
def test_quantized_hf_dir_is_dequantized_on_cpu(tiny_llm_dir, tmp_path, mode: str, bits: int) -> None:
    from mlx_lm.utils import load, save_config

    quantized_dir = tmp_path / mode
    shutil.copytree(tiny_llm_dir, quantized_dir)
    model, _, config = load(str(tiny_llm_dir), return_config=True)
    nn.quantize(model, group_size=32, bits=bits, mode=mode)
    mx.save_safetensors(str(quantized_dir / "model.safetensors"), dict(tree_flatten(model.parameters())))
    quantization = {"group_size": 32, "bits": bits} | ({"mode": mode} if mode != "affine" else {})
    save_config({**config, "quantization": quantization}, quantized_dir / "config.json")

    dense = load_model(str(quantized_dir), float32=True)
    kept = load_model(str(quantized_dir), float32=False)
    leaves = [m for _, m in tree_flatten(dense.model.leaf_modules(), is_leaf=nn.Module.is_module)]
    assert not [m for m in leaves if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))]
    assert isinstance(kept.model.model.layers[0].mlp.up_proj, nn.QuantizedLinear)
    assert {p.dtype for _, p in tree_flatten(dense.model.parameters())} == {mx.float32}
    ids = dense.tokenizer.encode("Hello world! This is a tiny language model.")
    np.testing.assert_allclose(_logits(dense.model, ids), _logits(kept.model, ids), atol=1e-3)


def test_a_missing_shard_or_tokenizer_is_named(tiny_llm_dir, tmp_path) -> None:
    # mlx-lm said "Missing 10 parameters: ..." for a shard an index names, and transformers blamed sentencepiece for
    # a directory without any tokenizer file.
    sharded = tmp_path / "sharded"
    shutil.copytree(tiny_llm_dir, sharded)
    (sharded / "model.safetensors").rename(sharded / "model-00001-of-00002.safetensors")
    weights = {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
               "model.norm.weight": "model-00002-of-00002.safetensors"}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weights}))
    with pytest.raises(ModelNotFound, match="model-00002-of-00002.safetensors named by model.safetensors.index.json "
                                            "is missing"):
        load_model(str(sharded))
    bare = tmp_path / "bare"
    shutil.copytree(tiny_llm_dir, bare)
    (bare / "tokenizer.json").unlink()
    with pytest.raises(ModelNotFound, match="has no tokenizer file"):
        load_model(str(bare))


def test_a_model_without_an_end_token_is_warned_about(tiny_llm_dir, tmp_path, caplog) -> None:
    quiet = tmp_path / "no-eos"
    shutil.copytree(tiny_llm_dir, quiet)
    for name in ("config.json", "tokenizer_config.json"):
        config = json.loads((quiet / name).read_text())
        config.pop("eos_token_id", None)
        config.pop("eos_token", None)
        (quiet / name).write_text(json.dumps(config))
    with caplog.at_level("WARNING", logger="engine.models"):
        load_model(str(quiet))
    assert "declares no end-of-sequence token" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="engine.models"):
        load_model(str(tiny_llm_dir))
    assert "end-of-sequence" not in caplog.text


def test_generation_config_gives_the_sampling_defaults(tiny_llm_dir, tmp_path, caplog) -> None:
    recommended = tmp_path / "recommended"
    shutil.copytree(tiny_llm_dir, recommended)
    (recommended / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_p": 2.5, "eos_token_id": [1, 2]}))
    with caplog.at_level("WARNING", logger="engine.generation_config"):
        loaded = load_model(str(recommended))
    assert loaded.sampling_defaults == {"temperature": 0.6, "top_p": 0.9, "top_k": 20}  # min_p 2.5 is no probability
    assert "min_p 2.5 is out of range" in caplog.text
    assert load_model(str(tiny_llm_dir)).sampling_defaults == {}


def test_cached_gguf_repo_resolves_to_its_file(hub_cache, tmp_path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    (files / "m.Q4_1.gguf").write_bytes(b"GGUF1")
    (files / "m.Q8_0.gguf").write_bytes(b"GGUF2")
    snapshot = put_in_hub_cache(hub_cache, "acme/m-GGUF", files)
    source = resolve_model("acme/m-GGUF/m.Q8_0.gguf")
    assert (source.kind, source.path, source.name) == ("gguf", snapshot / "m.Q8_0.gguf", "m.Q8_0")
    with pytest.raises(ModelNotFound, match="acme/m-GGUF/m.Q4_1.gguf"):
        resolve_model("acme/m-GGUF")


def test_hf_dir_for_a_directory_is_the_directory(tiny_llm_dir) -> None:
    assert hf_dir_for(str(tiny_llm_dir)) == tiny_llm_dir.resolve()


@pytest.mark.parametrize("spec", ["/no/such/model", "./nope", "~/nope-either", "not a repo/x y"])
def test_a_missing_path_or_bad_id_is_model_not_found(spec: str, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelNotFound, match="tandem models get"):
        resolve_model(spec)


def _with_generation_config(tiny_llm_dir: Path, tmp_path: Path, generation: dict, **config: object) -> Path:
    model = tmp_path / "model"
    shutil.copytree(tiny_llm_dir, model)
    (model / "config.json").write_text(json.dumps(json.loads((model / "config.json").read_text()) | config))
    (model / "generation_config.json").write_text(json.dumps(generation))
    return model


@pytest.mark.parametrize("eos", [0, [0, 7]])
def test_generation_config_eos_ids_stop_replies_zero_included(tiny_llm_dir, tmp_path, eos) -> None:
    # mlx-lm read generation_config.json's eos_token_id only when truthy: a model whose only end token is id 0 ran
    # past it, the token's text leaking into the reply.
    model = _with_generation_config(tiny_llm_dir, tmp_path, {"eos_token_id": eos}, eos_token_id=None)
    wanted = {0, 7} if isinstance(eos, list) else {0}
    assert wanted <= load_model(str(model)).tokenizer.eos_token_ids
    assert wanted <= models.load_tokenizer(model).eos_token_ids  # the service's copy (--isolate) agrees


def test_generation_config_max_new_tokens_is_the_default_max_tokens(tiny_llm_dir, tmp_path, caplog) -> None:
    # vLLM takes max_new_tokens as the default max_tokens; max_length (prompt + reply) is not used, and the log says so.
    model = _with_generation_config(tiny_llm_dir, tmp_path, {"max_new_tokens": 5, "max_length": 40})
    with caplog.at_level("INFO", logger="engine.generation_config"):
        assert load_model(str(model)).sampling_defaults == {"max_tokens": 5}
    assert "max_length 40 (prompt + reply) is not used: a request without max_tokens stops at max_new_tokens" \
        in caplog.text


def test_a_snapshot_path_is_named_by_its_repo(tiny_llm_dir, hub_cache) -> None:
    # /v1/models named a model served from its snapshot directory by the commit hash.
    snapshot = put_in_hub_cache(hub_cache, "tiny-org/tiny-llm", tiny_llm_dir)
    source = resolve_model(str(snapshot))
    assert (source.name, source.repo, source.path) == ("tiny-org/tiny-llm", "tiny-org/tiny-llm", snapshot)
    assert resolve_model(str(tiny_llm_dir)).name == tiny_llm_dir.name  # any other directory keeps its own name


def test_a_cached_file_whose_blob_is_missing_is_an_incomplete_download(tiny_llm_dir, hub_cache) -> None:
    # A dangling tokenizer.json link was reported as "has no tokenizer file".
    snapshot = put_in_hub_cache(hub_cache, "tiny-org/tiny-llm", tiny_llm_dir)
    (snapshot / "tokenizer.json").resolve().unlink()
    with pytest.raises(ModelNotFound, match=r"tokenizer.json links to a missing file \(an incomplete download\): "
                                            r"`tandem models get tiny-org/tiny-llm` fetches it again"):
        load_model("tiny-org/tiny-llm")


def test_a_template_only_in_chat_template_json_is_used_and_none_at_all_is_warned_of(tiny_llm_dir, tmp_path,
                                                                                       caplog) -> None:
    # A processor's chat_template.json is not read by a tokenizer: chats were plain "role: content" lines, unsaid.
    bare = tmp_path / "bare"
    shutil.copytree(tiny_llm_dir, bare)
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    with caplog.at_level("WARNING", logger="engine.models"):
        assert not load_model(str(bare)).tokenizer.has_chat_template
    assert "has no chat template" in caplog.text
    caplog.clear()
    (bare / "chat_template.json").write_text(json.dumps(
        {"chat_template": "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"}))
    with caplog.at_level("WARNING", logger="engine.models"):
        tokenizer = load_model(str(bare)).tokenizer
    assert "has no chat template" not in caplog.text
    messages = [{"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == "<user>hi<assistant>"
    assert models.load_tokenizer(bare).has_chat_template  # the service's copy (--isolate) agrees


def test_a_prompt_past_the_tokenizers_max_length_logs_no_indexing_warning(tiny_llm_dir, caplog) -> None:
    # The server refuses such a prompt itself (a 400); transformers' "indexing errors" line on every one was noise.
    import logging

    library = logging.getLogger("transformers")  # which does not propagate to caplog's root handler
    library.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING):
            for tokenizer in (load_model(str(tiny_llm_dir)).tokenizer, models.load_tokenizer(tiny_llm_dir)):
                assert len(tokenizer.encode("hello world " * 400)) > tokenizer.model_max_length == 2048
    finally:
        library.removeHandler(caplog.handler)
    assert not [r for r in caplog.records if "sequence length is longer" in r.getMessage()]
