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


def test_a_quick_return_shortens_the_interval_only_while_its_call_runs() -> None:
    import sys

    from engine.gil import QuickReturn

    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    try:
        with QuickReturn(0.0002).around():
            assert sys.getswitchinterval() == pytest.approx(0.0002)
        assert sys.getswitchinterval() == pytest.approx(0.005)
        with pytest.raises(RuntimeError, match="launch failed"), QuickReturn(0.0002).around():
            raise RuntimeError("launch failed")
        assert sys.getswitchinterval() == pytest.approx(0.005)  # restored on the way out of a failure too
        with QuickReturn(None).around():
            assert sys.getswitchinterval() == pytest.approx(0.005)  # off: left alone
    finally:
        sys.setswitchinterval(before)


@pytest.mark.parametrize(("value", "on"), [("on", True), ("off", False)])
def test_the_quick_return_follows_its_variable(monkeypatch: pytest.MonkeyPatch, value: str, on: bool) -> None:
    from engine.gil import GIL_RETURN_SECONDS, gil_return_seconds

    monkeypatch.setenv("TANDEM_GIL_RETURN", value)
    assert gil_return_seconds() == (GIL_RETURN_SECONDS if on else None)


def test_the_quick_return_is_off_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.gil import gil_return_seconds

    monkeypatch.delenv("TANDEM_GIL_RETURN", raising=False)
    assert gil_return_seconds() is None
