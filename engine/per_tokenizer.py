"""A value derived from a tokenizer (its template's variables, its pieces' bytes, its longest token), computed once
per tokenizer object and dropped with it."""

from __future__ import annotations

import weakref
from typing import Any, Callable, Generic, TypeVar

__all__ = ["PerTokenizer"]

T = TypeVar("T")


class PerTokenizer(Generic[T]):
    """`get(tokenizer)`: `build(tokenizer)` the first time, then the kept value (a tokenizer that cannot be weakly
    referenced gets it built each time)."""

    def __init__(self, build: Callable[[Any], T]) -> None:
        self._build = build
        self._values: "weakref.WeakKeyDictionary[Any, T]" = weakref.WeakKeyDictionary()

    def get(self, tokenizer: Any) -> T:
        """Raises what `build` raises."""
        try:
            return self._values[tokenizer]
        except (KeyError, TypeError):
            value = self._build(tokenizer)
            try:
                self._values[tokenizer] = value
            except TypeError:  # not weakly referenceable
                pass
            return value
