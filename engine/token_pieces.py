"""A token's text as the tokenizer writes it: the bytes of its piece (what log probabilities name each token by).
Detokenizing a stream (engine/sampling.py) joins pieces; this gives one piece alone, partial characters included."""

from __future__ import annotations

import codecs
import re
from typing import Any, Sequence

from engine.per_tokenizer import PerTokenizer

__all__ = ["TokenPieces", "token_pieces", "unfinished_bytes"]

_Bytes = bytes  # (inside TokenPieces, `bytes` names its method)


class TokenPieces:
    """Each token id's bytes as the tokenizer writes it: a byte-level BPE piece mapped back to its bytes, a
    SentencePiece piece with its "▁" as a space and "<0xNN>" as that byte, else the id decoded alone."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        detokenizer = getattr(tokenizer, "_detokenizer", None)  # mlx-lm's TokenizerWrapper keeps one
        tokenmap = getattr(detokenizer, "tokenmap", None)
        self._map: Sequence[Any] | None = tokenmap if isinstance(tokenmap, list) and tokenmap else None
        self._byte_level = self._map is not None and isinstance(self._map[0], str)
        # Without a map (mlx-lm's naive detokenizer: no tokenizer.json) a SentencePiece vocabulary's pieces are read
        # from the tokenizer: an id decoded alone loses its leading space and turns a byte into U+FFFD.
        self._sentencepiece = self._map is None and _is_sentencepiece(tokenizer)
        self._bytes: dict[int, bytes] = {}

    def bytes(self, token: int) -> bytes:
        """Raises nothing (an id outside the tokenizer's map is decoded alone)."""
        if (known := self._bytes.get(token)) is not None:
            return known
        piece = self._map[token] if self._map is not None and 0 <= token < len(self._map) else None
        if isinstance(piece, bytes):
            raw = piece.replace("\u2581".encode(), b" ")
        elif isinstance(piece, str) and self._byte_level:
            decoder = _byte_decoder()
            raw = b"".join(bytes([decoder[c]]) if c in decoder else c.encode() for c in piece)
        elif self._sentencepiece and (own := _sentencepiece_bytes(self._tokenizer, token)) is not None:
            raw = own
        else:
            try:
                raw = str(self._tokenizer.decode([token])).encode()
            except Exception:  # noqa: BLE001 — an undecodable id still gets an entry
                raw = b""
        if len(self._bytes) < 1 << 16:
            self._bytes[token] = raw
        return raw

    def text(self, token: int) -> str:
        """The token's bytes as text (a partial UTF-8 character as U+FFFD). Raises nothing."""
        return self.bytes(token).decode("utf-8", "replace")

    def unfinished_tail(self, tokens: Sequence[int]) -> tuple[_Bytes, int]:
        """The bytes these tokens end with that begin a UTF-8 character they do not finish (b"": they end on a
        character's end), and how many of the last tokens hold them (a token-id prompt may end mid-character).
        Raises nothing."""
        raw, pieces = b"", list[_Bytes]()
        for token in reversed(tokens[-8:]):  # an unfinished character's bytes: the last 3 at most
            pieces.append(piece := self.bytes(token))
            raw = piece + raw
            if len(raw) >= 3:
                break
        if not (n := unfinished_bytes(raw[-3:])):
            return b"", 0
        size = 0
        for count, piece in enumerate(pieces, 1):
            size += len(piece)
            if size >= n:
                return raw[-n:], count
        return raw[-n:], len(pieces)  # (not reached: the pieces hold all of raw)


def unfinished_bytes(raw: bytes) -> int:
    """How many of the last bytes begin a UTF-8 character that `raw` does not finish (0 to 3; pass its last 3 or
    fewer). Raises nothing."""
    return len(raw) - codecs.utf_8_decode(raw, "replace", False)[1]


_PIECES = PerTokenizer(TokenPieces)


def token_pieces(tokenizer: Any) -> TokenPieces:
    """The tokenizer's TokenPieces, built once (the engine's and the service's). Raises nothing."""
    return _PIECES.get(tokenizer)


def _byte_decoder() -> dict[str, int]:
    # GPT-2's byte ↔ printable-character table, as mlx-lm's BPE detokenizer reads pieces (cached there).
    from mlx_lm.tokenizer_utils import _byte_decoder as table

    return table()


_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _is_sentencepiece(tokenizer: Any) -> bool:
    """Whether the vocabulary writes a word's leading space as "▁" (SentencePiece's pieces). Raises nothing."""
    try:
        return any(piece.startswith("\u2581") for piece in tokenizer.get_vocab())
    except Exception:  # noqa: BLE001 — no readable vocabulary: ids are decoded alone
        return False


def _sentencepiece_bytes(tokenizer: Any, token: int) -> bytes | None:
    """The piece's bytes: "▁" a space, a byte-fallback piece "<0xNN>" that byte; None for an unknown id. Raises
    nothing."""
    try:
        piece = tokenizer.convert_ids_to_tokens(token)
    except Exception:  # noqa: BLE001 — an id outside the vocabulary
        return None
    if not isinstance(piece, str):
        return None
    if match := _BYTE_PIECE.fullmatch(piece):
        return bytes([int(match.group(1), 16)])
    return piece.replace("\u2581", " ").encode()
