"""`tandem models ls`: what the Hugging Face cache holds, damaged repos included and marked."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.cli.main import main
from tests.engine.test_models import hub_cache, put_in_hub_cache  # noqa: F401  (fixture)


def test_ls_marks_a_damaged_repo_with_what_is_wrong(tiny_llm_dir: Path, hub_cache: Path,  # noqa: F811
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # The repo was left out, though `tandem serve` serves a repo whose ref names a missing commit.
    put_in_hub_cache(hub_cache, "org/sound", tiny_llm_dir)
    (put_in_hub_cache(hub_cache, "org/no-blob", tiny_llm_dir) / "model.safetensors").resolve().unlink()
    assert main(["models", "ls"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert rows["org/no-blob"].endswith("[incomplete: model.safetensors missing (the blob is not in the cache)]")
    assert rows["org/sound"].endswith("snapshots/" + "0123abcd" * 5)
