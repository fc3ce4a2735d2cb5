"""engine/per_tokenizer.py: a value built once per tokenizer, dropped with it."""

from __future__ import annotations

import gc
from typing import Any

from engine.per_tokenizer import PerTokenizer


class Tokenizer:
    pass


def test_built_once_per_tokenizer_and_dropped_with_it() -> None:
    built: list[str] = []
    cache = PerTokenizer(lambda tok: built.append(type(tok).__name__) or len(built))
    a, b = Tokenizer(), Tokenizer()
    assert [cache.get(a), cache.get(a), cache.get(b)] == [1, 1, 2]
    assert len(cache._values) == 2
    del a
    gc.collect()
    assert len(cache._values) == 1  # nothing keeps a tokenizer alive


def test_a_tokenizer_without_weak_references_is_built_each_time() -> None:
    built: list[Any] = []
    cache = PerTokenizer(lambda tok: built.append(tok) or len(built))
    assert [cache.get("plain str"), cache.get("plain str")] == [1, 2]
