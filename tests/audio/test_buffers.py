"""audio/buffers.py: a growing buffer addressed by absolute sample, and one cap over all sessions."""

from __future__ import annotations

import numpy as np
import pytest

from audio.buffers import AudioBuffer, AudioLimitExceeded, AudioPool
from audio.errors import AudioInputError


def test_audio_buffer_addresses_absolute_samples() -> None:
    b = AudioBuffer()
    b.append(np.arange(10, dtype=np.float32))
    b.discard_before(4)
    b.append(np.arange(10, 20, dtype=np.float32))
    assert b.total == 20 and b.base == 4 and b.held == 16
    np.testing.assert_array_equal(b.view(8, 4), [8, 9, 10, 11])
    np.testing.assert_array_equal(b.view(18, 10), [18, 19])
    assert len(b.view(0, 3)) == 0 and len(b.view(25, 3)) == 0


def test_a_drained_buffer_gives_its_memory_back() -> None:
    b = AudioBuffer()
    b.append(np.zeros(16000 * 100, np.float32))
    b.discard_before(16000 * 100)
    assert b.held == 0 and b._data.nbytes <= 16000 * 8 * 4


class Owner:
    def __init__(self) -> None:
        self.held_samples = 0


def test_the_pool_refuses_past_its_cap_and_counts_what_owners_hold() -> None:
    pool = AudioPool(2.0)
    a, b = Owner(), Owner()
    pool.admit(a, 16000)
    a.held_samples = 16000
    pool.update(a)
    with pytest.raises(AudioLimitExceeded) as err:
        pool.admit(b, 16001)
    assert isinstance(err.value, AudioInputError) and err.value.code == "audio_buffer_full"
    assert err.value.param == "body"
    a.held_samples = 100  # transcribed: memory given back
    pool.update(a)
    pool.admit(b, 16001)
    pool.forget(a)
    assert pool.total == 0
    AudioPool(None).admit(a, 10**12)  # no cap
