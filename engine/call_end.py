"""Where a `<tool_call>` JSON block ends: at its end marker, written where the call's JSON is complete.

The calls' grammar (engine/constraints.py) lets a model write `</tool_call>` as characters inside a JSON string, as
an unconstrained model may too; ending the call at that text cut the arguments mid-string (a forced call came as
non-JSON with finish_reason "tool_calls"). So the marker ends the block only outside the call's strings; inside one
it is argument content. Outside, it ends the block even with an object left open: no grammar writes it there, and a
model that does meant its call to end (the call stays one, its arguments as written). The scan keeps its state
between reads: O(new text) per token.
"""

from __future__ import annotations

__all__ = ["CallEnd", "JsonStrings"]


class JsonStrings:
    """Whether a JSON text read one character at a time is inside a string (escapes kept track of)."""

    def __init__(self) -> None:
        self.inside = False
        self._escaped = False

    def read(self, ch: str) -> bool:
        """Move past `ch`; whether it belongs to a string, its quotes included. Raises nothing."""
        if self.inside:
            if self._escaped:
                self._escaped = False
            elif ch == "\\":
                self._escaped = True
            elif ch == '"':
                self.inside = False
            return True
        self.inside = ch == '"'
        return self.inside


class CallEnd:
    """The end marker of one open block, found in the block's text as it grows (`find`)."""

    def __init__(self, marker: str) -> None:
        self._marker = marker
        self._pos = 0  # block text scanned so far
        self._strings = JsonStrings()

    def find(self, block: str) -> int:
        """Where the marker that ends `block` (the block's text so far, from just after its opening marker) begins;
        -1 while none does. Raises nothing."""
        marker, i = self._marker, self._pos
        while i < len(block):
            ch = block[i]
            if not self._strings.read(ch) and ch == marker[0]:  # the marker's "<" is no quote: read moved nothing
                if block.startswith(marker, i):
                    self._pos = i
                    return i
                if marker.startswith(block[i:]):
                    break  # it may be the marker's beginning: read on once more is written
            i += 1
        self._pos = i
        return -1

    def held(self, block: str) -> int:
        """How many of `block`'s last characters may begin the end marker (after `find` returned -1 for it): only
        text outside the call's strings can. Raises nothing."""
        return len(block) - self._pos
