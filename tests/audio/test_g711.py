"""audio/g711.py: ITU-T G.711 μ-law and A-law codes decoded to 16-bit PCM, checked at the standard's code points
and, where the interpreter still has it (Python ≤ 3.12), against `audioop`, code for code."""

from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest

from audio.g711 import ALAW_TABLE, ULAW_TABLE, decode_g711


@pytest.mark.parametrize("code, value", [
    (0xFF, 0), (0x7F, 0),  # μ-law's two zeros
    (0x00, -32124), (0x80, 32124),  # the largest magnitudes: 8031 in the standard's 14 bits, × 4
    (0xFE, 8), (0x7E, -8),  # the first step above zero
    (0xF0, 120), (0xEF, 132),  # segment 0's last (steps of 8) and segment 1's first: 33 × 4 in the standard
])
def test_ulaw_code_points(code: int, value: int) -> None:
    assert int(ULAW_TABLE[code]) == value
    assert decode_g711(bytes([code]), "ulaw").tolist() == [value]


@pytest.mark.parametrize("code, value", [
    (0xD5, 8), (0x55, -8),  # the smallest magnitudes (A-law has no zero)
    (0xAA, 32256), (0x2A, -32256),  # the largest: 4032 in the standard's 13 bits, × 8
    (0x80, 5504), (0x00, -5504),
    (0xC5, 264), (0xD4, 24),  # segment 1's first value; segment 0's second
])
def test_alaw_code_points(code: int, value: int) -> None:
    assert int(ALAW_TABLE[code]) == value
    assert decode_g711(bytes([code]), "alaw").tolist() == [value]


@pytest.mark.parametrize("table", [ULAW_TABLE, ALAW_TABLE], ids=["ulaw", "alaw"])
def test_each_law_is_symmetric_and_monotonic(table: np.ndarray) -> None:
    assert table.dtype == np.int16 and table.shape == (256,)
    # a code and its sign-flipped twin are negatives; within a sign, levels are all distinct
    np.testing.assert_array_equal(table[:128], -table[128:])
    positive = table[table > 0]
    assert len(np.unique(positive)) == len(positive) >= 127


def test_bytes_decode_in_order() -> None:
    data = bytes([0xFF, 0x00, 0x80, 0x7E])
    assert decode_g711(data, "ulaw").tolist() == [0, -32124, 32124, -8]
    assert decode_g711(b"", "alaw").size == 0


@pytest.mark.skipif(importlib.util.find_spec("audioop") is None, reason="audioop is gone (Python 3.13+)")
def test_the_tables_are_audioops() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import audioop

    codes = bytes(range(256))
    np.testing.assert_array_equal(ULAW_TABLE, np.frombuffer(audioop.ulaw2lin(codes, 2), "<i2"))
    np.testing.assert_array_equal(ALAW_TABLE, np.frombuffer(audioop.alaw2lin(codes, 2), "<i2"))
