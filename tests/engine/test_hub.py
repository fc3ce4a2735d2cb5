"""engine.hub: what the local Hugging Face cache holds (`tandem models ls`) and downloading into it."""

from __future__ import annotations

import json

import pytest

from engine.errors import ModelNotFound
from engine.hub import ModelDownloadError, download_model, list_cached_models
from tests.engine.test_models import hub_cache, put_in_hub_cache  # noqa: F401  (fixture)


def test_list_cached_models_kinds_and_sizes(tiny_llm_dir, hub_cache, tmp_path) -> None:
    put_in_hub_cache(hub_cache, "tiny-org/tiny-llm", tiny_llm_dir)
    whisper = tmp_path / "whisper"
    whisper.mkdir()
    (whisper / "config.json").write_text(json.dumps({"n_mels": 80, "n_audio_ctx": 1500}))
    (whisper / "weights.npz").write_bytes(b"\0" * 1000)
    put_in_hub_cache(hub_cache, "mlx-community/whisper-tiny", whisper)
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "not-a-language-model"}))
    put_in_hub_cache(hub_cache, "acme/encoder", other)

    listed = {m.repo_id: m for m in list_cached_models()}
    assert list(listed) == ["acme/encoder", "mlx-community/whisper-tiny", "tiny-org/tiny-llm"]
    assert [listed[r].kind for r in listed] == ["other", "whisper", "llm"]
    expected = sum(f.stat().st_size for f in tiny_llm_dir.iterdir())
    assert listed["tiny-org/tiny-llm"].size_bytes == expected
    assert (listed["tiny-org/tiny-llm"].path / "config.json").is_file()


def test_list_cached_models_without_a_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "missing"))
    assert list_cached_models() == []


def test_download_uses_the_hub_cache_and_maps_errors(hub_cache, monkeypatch) -> None:
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError

    calls = []

    def fake_snapshot_download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        if repo_id == "missing/repo":
            # Built without an HTTP response, which only the real client has.
            error = RepositoryNotFoundError.__new__(RepositoryNotFoundError)
            Exception.__init__(error, "404 Repository Not Found")
            raise error
        if repo_id == "offline/repo":
            raise LocalEntryNotFoundError("no connection")
        return str(hub_cache / "models--org--name" / "snapshots" / "abc")

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_snapshot_download)
    assert download_model("org/name", progress=False) == hub_cache / "models--org--name" / "snapshots" / "abc"
    repo_id, kwargs = calls[0]
    assert kwargs["cache_dir"] == hub_cache
    patterns = kwargs["allow_patterns"]
    assert {"model*.safetensors", "weights.npz", "*.json"} <= set(patterns) and "*.gguf" not in patterns
    with pytest.raises(ModelNotFound):
        download_model("missing/repo", progress=False)
    with pytest.raises(ModelDownloadError, match="could not reach"):
        download_model("offline/repo", progress=False)


def test_a_ref_naming_a_missing_snapshot_says_which_one_serves(tiny_llm_dir, hub_cache, caplog) -> None:
    # An interrupted download: refs/main names a snapshot the cache lacks. The newest one present serves, and the
    # log says so (its errors, e.g. a snapshot without weights, looked unrelated to the ref).
    from engine.hub import snapshot_dir

    snapshot = put_in_hub_cache(hub_cache, "org/tiny", tiny_llm_dir)
    (snapshot.parent.parent / "refs" / "main").write_text("f" * 40)
    with caplog.at_level("WARNING", logger="engine.hub"):
        assert snapshot_dir("org/tiny") == snapshot
    assert f"refs/main names snapshot {'f' * 40}, which is not in the cache; using {snapshot.name}" in caplog.text


def test_damaged_repos_are_listed_with_what_is_wrong(tiny_llm_dir, hub_cache) -> None:
    # The cache scan leaves out repos it finds damaged, and `tandem models ls` hid them, though `tandem serve`
    # serves one whose ref names a missing commit.
    put_in_hub_cache(hub_cache, "org/sound", tiny_llm_dir)
    ref = put_in_hub_cache(hub_cache, "org/bad-ref", tiny_llm_dir).parent.parent / "refs" / "main"
    ref.write_text("f" * 40)
    (put_in_hub_cache(hub_cache, "org/no-blob", tiny_llm_dir) / "tokenizer.json").resolve().unlink()

    listed = {m.repo_id: m for m in list_cached_models()}
    assert list(listed) == ["org/bad-ref", "org/no-blob", "org/sound"]
    assert listed["org/sound"].problem is None
    assert listed["org/bad-ref"].problem == f"broken: refs/main names commit {'f' * 40}, which is not in the cache"
    assert listed["org/no-blob"].problem == "incomplete: tokenizer.json missing (the blob is not in the cache)"
    assert {m.kind for m in listed.values()} == {"llm"}
    tokenizer_bytes = (tiny_llm_dir / "tokenizer.json").stat().st_size
    assert listed["org/no-blob"].size_bytes == listed["org/sound"].size_bytes - tokenizer_bytes


def test_get_fetches_what_a_faster_whisper_repo_needs() -> None:
    # `tandem models get Systran/faster-whisper-*` fetched the config and vocabulary but not the CTranslate2
    # weights, model.bin: the repo was listed as whisper and failed to import.
    from huggingface_hub.utils import filter_repo_objects

    from engine.hub import MODEL_FILE_PATTERNS

    def fetched(files: list[str]) -> set[str]:
        return set(filter_repo_objects(files, allow_patterns=MODEL_FILE_PATTERNS))

    tiny = [".gitattributes", "README.md", "config.json", "model.bin", "tokenizer.json", "vocabulary.txt"]
    assert fetched(tiny) == {"config.json", "model.bin", "tokenizer.json", "vocabulary.txt"}
    large_v3 = ["config.json", "model.bin", "preprocessor_config.json", "tokenizer.json", "vocabulary.json"]
    assert fetched(large_v3) == set(large_v3)
    # A PyTorch duplicate of an LLM's safetensors still stays behind.
    assert fetched(["model.safetensors", "pytorch_model.bin", "config.json"]) == {"model.safetensors", "config.json"}
