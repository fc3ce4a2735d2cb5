"""`tandem generate`: sampling values are checked up front (argparse, exit 2, before any model loads),
an engine refusal is one line, and `-` reads the prompt from stdin."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from service.cli.main import main


@pytest.mark.parametrize("flag, value", [
    ("--temperature", "-1"), ("--temperature", "nan"), ("--temperature", "inf"), ("--seed", "-5"),
    ("--seed", str(2**64)), ("--max-tokens", "0"),
])
def test_bad_sampling_values_stop_before_the_model_loads(flag: str, value: str, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import engine.models

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model must not load")

    monkeypatch.setattr(engine.models, "load_model", no_load)
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "hi", flag, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert f"argument {flag}:" in err and "Traceback" not in err


def test_an_engine_refusal_is_one_line(tiny_llm_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    long = "hello " * 3000  # past the tiny model's 2,048 context
    assert main(["generate", long, "--model", str(tiny_llm_dir), "--max-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tandem: ") and err.count("\n") == 1, err


def test_a_model_or_template_that_fails_is_one_line(tiny_llm_dir: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # A weights file missing, and a template that raises on a system message (as Mistral's and Gemma's do): these
    # printed Python tracebacks. The prompt past the context names the context, not a clamped max_tokens of 1.
    import json
    import shutil

    broken = tmp_path / "no-weights"
    shutil.copytree(tiny_llm_dir, broken)
    (broken / "model.safetensors").unlink()
    strict = tmp_path / "strict"
    shutil.copytree(tiny_llm_dir, strict)
    config = json.loads((strict / "tokenizer_config.json").read_text())
    config["chat_template"] = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
                               "supported') }}{% endif %}" + config["chat_template"])
    (strict / "tokenizer_config.json").write_text(json.dumps(config))
    cases = [(["generate", "hi", "--model", str(broken)], "could not load model"),
             (["generate", "hi", "--model", str(strict), "--system", "be brief"], "System role not supported"),
             (["generate", "hello " * 3000, "--model", str(tiny_llm_dir)], "leaves no room in the model's context")]
    for argv, message in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and err.count("\n") == 1, err


def test_a_dash_reads_the_prompt_from_stdin(tiny_llm_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    def prompt_tokens(prompt: str) -> int:
        assert main(["generate", prompt, "--model", str(tiny_llm_dir), "--max-tokens", "1"]) == 0
        return int(capsys.readouterr().err.rsplit("[", 1)[1].split(" prompt")[0])

    monkeypatch.setattr("sys.stdin", io.StringIO("What is 2+2?\n"))
    assert prompt_tokens("-") == prompt_tokens("What is 2+2?")


def test_an_empty_stdin_prompt_is_refused(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("  \n"))
    assert main(["generate", "-"]) == 2
    assert "empty" in capsys.readouterr().err


def test_a_closed_stdin_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # `tandem generate - <&-`: Python leaves sys.stdin None, and .read() was an AttributeError traceback.
    monkeypatch.setattr("sys.stdin", None)
    assert main(["generate", "-"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tandem: - reads the prompt from stdin, which is closed") and err.count("\n") == 1, err


def test_thinking_goes_to_stderr_and_the_answer_to_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A template that opens a think block: the reply, all thinking here, was printed as the answer, markup and all.
    from tests.fixtures.tiny_llm import CHATML_TEMPLATE, build_tiny_llm

    opens = CHATML_TEMPLATE.replace("'<|im_start|>assistant\n'", "'<|im_start|>assistant\n<think>\n'")
    model = build_tiny_llm(tmp_path / "thinks", extra_special_tokens=("<think>", "</think>"), chat_template=opens)
    assert main(["generate", "hi", "--model", str(model), "--max-tokens", "12"]) == 0
    out, err = capsys.readouterr()
    assert out == "\n" and "</think>" not in err
    assert err.rsplit("[", 1)[0].strip(), err  # the thinking, before the token count line


def test_an_adapter_changes_the_reply_as_mlx_lm_applies_it(tiny_llm_dir: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    # mlx_lm.generate's `--adapter-path`: the fine-tune's reply, as mlx-lm's own loader gives it.
    from mlx_lm.utils import load

    from service.chat.prompt import render_prompt
    from tests.fixtures.tiny_adapter import build_tiny_adapter

    adapter = build_tiny_adapter(tiny_llm_dir, tmp_path / "lora")

    def reply(*extra: str) -> str:
        assert main(["generate", "Hello world", "--model", str(tiny_llm_dir), "--max-tokens", "8", *extra]) == 0
        return capsys.readouterr().out

    import mlx.core as mx
    from mlx_lm.generate import generate_step

    model, tokenizer = load(str(tiny_llm_dir), adapter_path=str(adapter))
    prompt = render_prompt(tokenizer, [{"role": "user", "content": "Hello world"}])
    tokens = [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=8)]
    adapted = reply("--adapter-path", str(adapter))
    assert adapted.strip() and adapted != reply()
    assert tokenizer.decode(tokens).strip()[:12] in adapted
    assert main(["generate", "hi", "--adapter-path", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "--adapter-path: adapter path" in err and "is not a directory" in err and err.count("\n") == 1


def test_a_reader_that_leaves_early_stops_generate_quietly(tiny_llm_dir: Path) -> None:
    # `tandem generate ... | head -c 10` ended in a BrokenPipeError traceback and exit 1.
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-m", "service.cli", "generate", "hello", "--model", str(tiny_llm_dir),
                              "--max-tokens", "200", "--temperature", "1.0", "--seed", "3"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    child.stdout.read(1)  # the reply has begun: the reader goes
    child.stdout.close()
    err = child.stderr.read().decode()
    assert child.wait(timeout=120) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_a_prompt_that_is_not_utf8_is_named_so(tiny_llm_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # printf '\xff\xfe bad' | tandem generate - said "the model's chat template refused the messages: TextEncodeInput..."
    assert main(["generate", "\udcff\udcfe bad", "--model", str(tiny_llm_dir)]) == 2
    assert "the prompt is not UTF-8 text" in capsys.readouterr().err


def _generate(capsys: pytest.CaptureFixture[str], model: Path, *flags: str) -> tuple[str, str]:
    assert main(["generate", "hello", "--model", str(model), "--max-tokens", "24", *flags]) == 0
    out, err = capsys.readouterr()
    return out.removesuffix("\n"), err


def test_stop_ends_the_reply_before_its_text(tiny_llm_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import re

    whole, _ = _generate(capsys, tiny_llm_dir)
    found = re.search(r"[A-Za-z]{2}", whole[2:])
    assert found is not None, whole
    cut = whole.index(found.group())
    out, err = _generate(capsys, tiny_llm_dir, "--stop", "never in it", "--stop", found.group())  # repeatable
    assert out == whole[:cut] and "finish: stop" in err, (whole, out, err)


def test_top_p_narrows_the_draw(tiny_llm_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    greedy, _ = _generate(capsys, tiny_llm_dir)
    sampled = ["--temperature", "1", "--seed", "7"]
    assert _generate(capsys, tiny_llm_dir, *sampled)[0] != greedy  # a random tiny model: the draw wanders
    assert _generate(capsys, tiny_llm_dir, *sampled, "--top-p", "1e-9")[0] == greedy  # a nucleus of one token
    assert _generate(capsys, tiny_llm_dir, *sampled, "--top-p", "0")[0] == greedy  # 0: greedy, as the API's


@pytest.mark.parametrize("flag, value", [("--top-p", "1.5"), ("--top-p", "nan"), ("--stop", "")])
def test_bad_top_p_and_stop_values_are_refused(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "hi", flag, value])
    assert exit_.value.code == 2 and f"argument {flag}:" in capsys.readouterr().err
