"""engine/gil.py: the GIL switch interval to serve with, from TANDEM_GIL_SWITCH_MS or Python's 5 ms."""

from __future__ import annotations

import pytest

from engine.gil import GIL_SWITCH_SECONDS, gil_switch_seconds


def test_the_default_is_pythons_5_ms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TANDEM_GIL_SWITCH_MS", raising=False)
    assert gil_switch_seconds() == GIL_SWITCH_SECONDS == 0.005


@pytest.mark.parametrize(("value", "seconds"), [("0.5", 0.0005), ("5", 0.005), ("20", 0.02)])
def test_milliseconds_from_the_environment(monkeypatch: pytest.MonkeyPatch, value: str, seconds: float) -> None:
    monkeypatch.setenv("TANDEM_GIL_SWITCH_MS", value)
    assert gil_switch_seconds() == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["0", "-1", "fast", "nan", "inf", ""])
def test_a_value_that_is_not_a_positive_number_is_refused_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("TANDEM_GIL_SWITCH_MS", value)
    with pytest.raises(ValueError, match="TANDEM_GIL_SWITCH_MS"):
        gil_switch_seconds()
