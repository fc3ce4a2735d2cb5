"""engine/generation_config.py: what a checkpoint's generation_config.json recommends, as vLLM reads it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from engine.generation_config import sampling_defaults


@pytest.mark.parametrize("top_k, taken", [(-1, 0), (0, 0), (20, 20)])
def test_top_k_minus_one_is_no_top_k_without_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                       top_k: int, taken: int) -> None:
    # -1 is "disabled" in vLLM's and transformers' configs; it was dropped as "out of range" with a warning.
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_k": top_k, "temperature": 0.7}))
    with caplog.at_level(logging.WARNING, logger="engine.generation_config"):
        assert sampling_defaults(tmp_path) == {"top_k": taken, "temperature": 0.7}
    assert not caplog.records


def test_a_top_k_below_minus_one_is_still_out_of_range(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_k": -2}))
    with caplog.at_level(logging.WARNING, logger="engine.generation_config"):
        assert sampling_defaults(tmp_path) == {}
    assert "top_k -2 is out of range" in caplog.text
