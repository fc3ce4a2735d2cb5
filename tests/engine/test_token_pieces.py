"""engine/token_pieces.py: one token's bytes as its tokenizer writes it — byte-level BPE pieces mapped back to
bytes, SentencePiece pieces with their "▁" as a space, else the id decoded alone."""

from __future__ import annotations

from typing import Any

from engine.token_pieces import TokenPieces


class _Detokenizer:
    def __init__(self, tokenmap: list[Any]) -> None:
        self.tokenmap = tokenmap


class _Tokenizer:
    def __init__(self, tokenmap: list[Any] | None) -> None:
        self._detokenizer = _Detokenizer(tokenmap) if tokenmap is not None else None

    def decode(self, tokens: list[int]) -> str:
        return f"<{tokens[0]}>"


def test_token_pieces_map_byte_level_and_sentencepiece_pieces_to_their_bytes() -> None:
    # Byte-level BPE writes a space as "Ġ" and each byte of "é" as its own printable character.
    byte_level = TokenPieces(_Tokenizer(["Ġcaf", "Ã©", "Ã", "<|im_end|>"]))
    assert byte_level.bytes(0) == b" caf" and byte_level.bytes(1) == "é".encode()
    assert byte_level.bytes(2) == b"\xc3" and byte_level.text(2) == "\ufffd"  # half a character
    assert byte_level.text(3) == "<|im_end|>"
    spm = TokenPieces(_Tokenizer([b"\xe2\x96\x81hello", b"\xc3"]))
    assert spm.bytes(0) == b" hello" and spm.bytes(1) == b"\xc3"
    assert TokenPieces(_Tokenizer(None)).text(7) == "<7>"  # no map: the id decoded alone
    assert byte_level.text(99) == "<99>"


class _SentencePieceOnly(_Tokenizer):
    """mlx-lm's naive detokenizer (no tokenmap) over SentencePiece pieces: decoding an id alone drops its "▁"."""

    pieces = ["<unk>", "\u2581world", "<0xF0>", "<0x20>", "</s>"]

    def __init__(self) -> None:
        super().__init__(None)

    def get_vocab(self) -> dict[str, int]:
        return {p: i for i, p in enumerate(self.pieces)}

    def convert_ids_to_tokens(self, token: int) -> str | None:
        return self.pieces[token] if 0 <= token < len(self.pieces) else None


def test_sentencepiece_pieces_without_a_map_are_read_from_the_tokenizer() -> None:
    pieces = TokenPieces(_SentencePieceOnly())
    assert [pieces.bytes(t) for t in range(5)] == [b"<unk>", b" world", b"\xf0", b" ", b"</s>"]
    assert pieces.text(99) == "<99>"  # unknown to the vocabulary: decoded alone


def test_a_sentencepiece_only_checkpoints_pieces_keep_their_space_and_bytes(sentencepiece_tokenizer) -> None:
    tok = sentencepiece_tokenizer
    assert not hasattr(tok._detokenizer, "tokenmap")  # mlx-lm's naive detokenizer
    pieces = TokenPieces(tok)
    ids = tok.convert_tokens_to_ids(["\u2581world", "<0xF0>", "<0x20>", "<0xC3>"])
    assert [pieces.bytes(t) for t in ids] == [b" world", b"\xf0", b" ", b"\xc3"]
    assert pieces.text(ids[0]) == " world"


def test_the_unfinished_tail_is_the_bytes_of_a_last_character_the_tokens_only_begin() -> None:
    # A token-id prompt may end mid-character: the reply's text finishes it (engine/stop_matcher.py).
    pieces = TokenPieces(_Tokenizer([b"\xe2\x96\x81hi", b"\xc3", b"\xe6", b"\x97", b"ab\xe6", b"", b"\xa9"]))
    assert pieces.unfinished_tail([0, 1]) == (b"\xc3", 1)
    assert pieces.unfinished_tail([0, 2, 3]) == (b"\xe6\x97", 2)  # over two tokens
    assert pieces.unfinished_tail([0, 4]) == (b"\xe6", 1)  # the end of a token whose start is whole
    assert pieces.unfinished_tail([4, 3, 5]) == (b"\xe6\x97", 3)  # an empty piece after it
    assert pieces.unfinished_tail([0, 1, 6]) == (b"", 0)  # "é" finished
    assert pieces.unfinished_tail([0, 2, 3, 3]) == (b"", 0)  # a whole 3-byte character
    assert pieces.unfinished_tail([0, 6]) == (b"", 0) and pieces.unfinished_tail([]) == (b"", 0)  # (a stray byte)
