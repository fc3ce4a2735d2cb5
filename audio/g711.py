"""G.711 (ITU-T): μ-law and A-law, 8-bit codes of 8 kHz telephony audio (Twilio's media streams, OpenAI's
`g711_ulaw` / `audio/pcmu`), decoded to 16-bit linear PCM.

The tables are the standard's decoder outputs scaled to 16 bits, as Sun's g711.c and Python's `audioop` (gone
in 3.13) give them: μ-law 0xFF → 0, 0x00 → -32124; A-law 0xD5 → 8, 0xAA → 32256.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

__all__ = ["Law", "ULAW_TABLE", "ALAW_TABLE", "decode_g711"]

Law = Literal["ulaw", "alaw"]


def _ulaw_table() -> np.ndarray:
    # codes are sent inverted; 4 mantissa bits over 8 segments, a bias of 0x84 keeping segment 0 linear
    code = ~np.arange(256, dtype=np.int32) & 0xFF
    magnitude = (((code & 0x0F) << 3) + 0x84) << ((code & 0x70) >> 4)
    return np.where(code & 0x80, 0x84 - magnitude, magnitude - 0x84).astype(np.int16)


def _alaw_table() -> np.ndarray:
    # even bits are sent inverted (0x55); segment 0 is linear, each later one doubles the step
    code = np.arange(256, dtype=np.int32) ^ 0x55
    segment = (code & 0x70) >> 4
    mantissa = (code & 0x0F) << 4
    magnitude = np.where(segment == 0, mantissa + 8, (mantissa + 0x108) << np.maximum(segment - 1, 0))
    return np.where(code & 0x80, magnitude, -magnitude).astype(np.int16)


ULAW_TABLE = _ulaw_table()
ALAW_TABLE = _alaw_table()
_TABLES = {"ulaw": ULAW_TABLE, "alaw": ALAW_TABLE}


def decode_g711(data: bytes, law: Law) -> np.ndarray:
    """One byte a sample → int16 samples (1-D, same length). Raises KeyError for an unknown law."""
    return _TABLES[law][np.frombuffer(data, dtype=np.uint8)]
