"""StopMatcher: a row's tokens as text (stop strings held back, UTF-8 never split, SentencePiece-only tokenizers,
special tokens left out) and when the row stops."""

from __future__ import annotations

import pytest

from engine.stop_matcher import StopMatcher


# -- stop matching on the tiny model's byte-level tokenizer -------------------------------------------


def feed(matcher: StopMatcher, tokens: list[int]) -> tuple[list[str], str | None]:
    pieces: list[str] = []
    for t in tokens:
        step = matcher.add(t)
        pieces.append(step.text)
        if step.finish_reason:
            return pieces, step.finish_reason
    return pieces, None


def test_stop_string_is_held_back_and_never_emitted(tiny_loaded) -> None:
    tok = tiny_loaded.tokenizer
    ids = tok.encode("Hello world! This is a tiny model")
    m = StopMatcher(tok, stop=["world!"], max_tokens=100)
    pieces, reason = feed(m, ids)
    assert reason == "stop"
    assert "".join(pieces) == "Hello "
    assert all("w" not in p for p in pieces)  # "w" could start "world!": never shown


def test_the_stop_string_that_cut_the_text_is_named(tiny_loaded) -> None:
    # Anthropic's stop_sequence names it; the earliest in the text wins, whatever the list's order.
    tok = tiny_loaded.tokenizer
    m = StopMatcher(tok, stop=["tiny", "never", "This"], max_tokens=100)
    pieces, reason = feed(m, tok.encode("Hello world! This is a tiny model"))
    assert (reason, "".join(pieces), m.stopped_by) == ("stop", "Hello world! ", "This")
    eos = StopMatcher(tok, stop=["never"], max_tokens=100)
    feed(eos, [*tok.encode("Hello"), tok.eos_token_id])
    assert eos.finish_reason == "stop" and eos.stopped_by is None


def test_possible_stop_prefix_is_released_once_disambiguated(tiny_loaded) -> None:
    tok = tiny_loaded.tokenizer
    text = "The quick brown fox jumps over the lazy dog."
    ids = tok.encode(text)
    m = StopMatcher(tok, stop=["fox eats"], max_tokens=len(ids))
    pieces, reason = feed(m, ids)
    assert reason == "length"
    assert "".join(pieces) == text
    emitted = ""
    for p in pieces:  # "fox" is withheld until " jumps" shows it is not "fox eats"
        emitted += p
        assert not emitted.endswith("fox")


def test_stop_string_spanning_tokens_is_cut_mid_token(tiny_loaded) -> None:
    tok = tiny_loaded.tokenizer
    ids = tok.encode("Continuous batching packs decode rows")
    m = StopMatcher(tok, stop=["ing pa"], max_tokens=100)
    pieces, reason = feed(m, ids)
    assert (reason, "".join(pieces)) == ("stop", "Continuous batch")


def test_utf8_characters_are_never_split(tiny_loaded) -> None:
    tok = tiny_loaded.tokenizer
    text = "Café 日本語 🙂 naïve"
    ids = tok.encode(text)
    assert len(ids) > len(text.split())  # multi-byte characters span several tokens
    m = StopMatcher(tok, max_tokens=len(ids))
    pieces, reason = feed(m, ids)
    assert reason == "length"
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text


def byte_tokens(tok, raw: bytes) -> list[int]:
    """The byte-level tokenizer's one-byte tokens for these bytes (each byte is a piece of its own)."""
    from engine.stop_matcher import _byte_encoder

    return [tok.convert_tokens_to_ids(_byte_encoder()[b]) for b in raw]


@pytest.mark.parametrize("stop", [(), ("zz",), ("\ufffd",)])
def test_a_reply_ending_inside_a_character_writes_none_of_it(tiny_loaded, stop: tuple[str, ...]) -> None:
    # max_tokens (or an end token) after "日"'s first two bytes: the reply ended "Hi \ufffd", and a stop string
    # "\ufffd" matched that and turned "length" into "stop".
    tok = tiny_loaded.tokenizer
    ids = tok.encode("Hi", add_special_tokens=False) + byte_tokens(tok, " 日".encode()[:3])
    pieces, reason = feed(StopMatcher(tok, stop=stop, max_tokens=len(ids)), ids)
    assert ("".join(pieces), reason) == ("Hi ", "length") and all("\ufffd" not in p for p in pieces)
    pieces, reason = feed(StopMatcher(tok, stop=stop, max_tokens=50), [*ids, tok.eos_token_id])
    assert ("".join(pieces), reason) == ("Hi ", "stop")
    finished = byte_tokens(tok, "日".encode()[2:])
    pieces, _ = feed(StopMatcher(tok, stop=stop, max_tokens=len(ids) + 1), ids + finished)
    assert "".join(pieces) == "Hi 日"


def test_a_continuation_finishes_the_character_its_prompt_ends_inside(tiny_loaded) -> None:
    # A token-id prompt ending with "日"'s first two bytes: the reply's third byte writes "日" (a decode of the two
    # together), not U+FFFD for a byte decoded alone.
    tok = tiny_loaded.tokenizer
    prompt = tok.encode("Hi", add_special_tokens=False) + byte_tokens(tok, " 日".encode()[:3])
    reply = byte_tokens(tok, "日".encode()[2:]) + tok.encode(" ok", add_special_tokens=False)
    assert tok.decode(prompt + reply) == "Hi 日 ok"
    for stop in ((), ("zz",)):
        pieces, _ = feed(StopMatcher(tok, stop=stop, max_tokens=len(reply), keep_leading_space=True,
                                     continued=prompt), reply)
        assert ("".join(pieces), pieces[0]) == ("日 ok", "日")
    pieces, _ = feed(StopMatcher(tok, max_tokens=1, keep_leading_space=True, continued=prompt), byte_tokens(tok, b"a"))
    assert "".join(pieces) == "\ufffda"  # never finished: as the decode of the two writes it
    pieces, _ = feed(StopMatcher(tok, max_tokens=len(reply), keep_leading_space=True,
                                 continued=tok.encode("Hi", add_special_tokens=False)), reply)
    assert "".join(pieces) == "\ufffd ok"  # a prompt that ends on a character's end: the byte alone


def test_max_tokens_finishes_with_length(tiny_loaded) -> None:
    tok = tiny_loaded.tokenizer
    m = StopMatcher(tok, max_tokens=3)
    pieces, reason = feed(m, tok.encode("The quick brown fox jumps"))
    assert reason == "length"
    assert len(pieces) == 3


def test_eos_and_stop_token_ids_finish_without_their_text(tiny_loaded) -> None:
    tok = tiny_loaded.tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    pieces, reason = feed(StopMatcher(tok, max_tokens=50), tok.encode("Hello") + [im_end])
    assert reason == "stop" and "".join(pieces) == "Hello"
    fox = tok.encode(" fox")
    pieces, reason = feed(StopMatcher(tok, stop_token_ids=fox[:1], max_tokens=50), tok.encode("The quick brown fox"))
    assert reason == "stop" and "".join(pieces) == "The quick brown"


def test_ignore_eos_goes_past_the_end_of_sequence_token_to_max_tokens(tiny_loaded) -> None:
    # vLLM's ignore_eos (SillyTavern's "vLLM" type sends it): the row ends at max_tokens or a stop token/string.
    tok = tiny_loaded.tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    ids = tok.encode("Hello") + [im_end] + tok.encode(" world") + [im_end]
    pieces, reason = feed(StopMatcher(tok, max_tokens=len(ids), ignore_eos=True), ids)
    assert (reason, "".join(pieces)) == ("length", "Hello world")  # the ends written are special: left out
    pieces, _ = feed(StopMatcher(tok, max_tokens=len(ids), ignore_eos=True, skip_special_tokens=False), ids)
    assert "".join(pieces) == "Hello<|im_end|> world<|im_end|>"
    pieces, reason = feed(StopMatcher(tok, stop=["wor"], max_tokens=len(ids), ignore_eos=True), ids)
    assert (reason, "".join(pieces)) == ("stop", "Hello ")
    pieces, reason = feed(StopMatcher(tok, stop_token_ids=[im_end], max_tokens=len(ids), ignore_eos=True), ids)
    assert (reason, "".join(pieces)) == ("stop", "Hello")  # a stop token the request names still ends it


def test_min_tokens_lets_no_end_token_end_the_row_before_it(tiny_loaded) -> None:
    tok = tiny_loaded.tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    hello = tok.encode("Hello")
    ids = hello + [im_end] + tok.encode(" world") + [im_end]
    pieces, reason = feed(StopMatcher(tok, max_tokens=50, min_tokens=len(hello) + 1), ids)
    assert (reason, "".join(pieces)) == ("stop", "Hello world")  # the first end was token min_tokens: passed over
    pieces, reason = feed(StopMatcher(tok, max_tokens=50, min_tokens=len(hello)), ids)
    assert (reason, "".join(pieces)) == ("stop", "Hello")  # the one after min_tokens ends it
    fox = tok.encode(" fox")
    pieces, reason = feed(StopMatcher(tok, stop_token_ids=fox[:1], max_tokens=50, min_tokens=50),
                          tok.encode("The quick brown fox"))
    assert (reason, "".join(pieces)) == (None, "The quick brown fox")


def test_min_tokens_lets_a_stop_string_end_the_row_only_past_its_tokens_text_as_vllm(tiny_loaded) -> None:
    # vLLM's detokenizer checks stop strings only once min_tokens are written, in the text from there on (its
    # tests/detokenizer/test_min_tokens.py): a stop string ending in the first min_tokens tokens' text is passed over.
    tok = tiny_loaded.tokenizer
    text = "Hello world! This is a tiny model"
    ids = tok.encode(text)
    upto = {tok.decode(ids[:n]): n for n in range(len(ids) + 1)}  # a prefix's text → its tokens

    def run(stop: str, min_tokens: int) -> tuple[str, str | None]:
        pieces, reason = feed(StopMatcher(tok, stop=[stop], max_tokens=len(ids), min_tokens=min_tokens), ids)
        return "".join(pieces), reason

    assert run("o", 0) == ("Hell", "stop")
    assert run("o", upto["Hello world"]) == ("Hello world! This is a tiny m", "stop")
    assert run("o", len(ids)) == (text, "length")
    # One that starts in that text and ends past it does end the row, cut where it starts.
    assert run("world!", upto["Hello wo"]) == ("Hello ", "stop")
    assert run("world!", upto["Hello world!"]) == (text, "length")


def test_a_finished_matcher_refuses_more_tokens(tiny_loaded) -> None:
    m = StopMatcher(tiny_loaded.tokenizer, max_tokens=1)
    m.add(5)
    with pytest.raises(RuntimeError):
        m.add(6)


def test_a_byte_level_replys_first_token_keeps_its_leading_space_as_the_tokenizers_decode(tiny_loaded) -> None:
    # A chat reply's " World" is " World" (its log probabilities' bytes, vLLM's text); mlx-lm trimmed it off but in a
    # continuation (" 4" after "1, 2, 3,").
    tok = tiny_loaded.tokenizer
    ids = tok.encode(" 4, 5,")
    assert tok.decode(ids[:1]).startswith(" ") and tok.decode(ids) == " 4, 5,"
    for stop in ((), ("6",)):
        reply, _ = feed(StopMatcher(tok, stop=stop, max_tokens=len(ids)), ids)
        continued, _ = feed(StopMatcher(tok, stop=stop, max_tokens=len(ids), keep_leading_space=True), ids)
        assert ("".join(reply), "".join(continued)) == (" 4, 5,", " 4, 5,")


@pytest.mark.parametrize("keep", [False, True])
def test_a_tokens_position_counts_a_space_the_detokenizer_holds(tiny_loaded, keep: bool) -> None:
    # "1, 2, 3": the lone " " before "3" waits in the detokenizer; "3" starts after it, where "3, 4" cuts the text
    tok = tiny_loaded.tokenizer
    text = "1, 2, 3, 4"
    ids = tok.encode(text)
    m = StopMatcher(tok, stop=["3, 4"], max_tokens=len(ids), keep_leading_space=keep)
    starts = []
    for t in ids:
        starts.append(m.position())
        if m.add(t).finish_reason:
            break
    pieces = [tok.decode([t]) for t in ids]
    assert starts == [sum(len(p) for p in pieces[:i]) for i in range(len(starts))]
    assert m.shown_before() == len("1, 2, ")


# SentencePiece pieces mlx-lm's naive detokenizer streams (no tokenizer.json): "hello😀 world é" with its " " and
# both characters as byte pieces.
SPM_REPLY = ["\u2581hello", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>", "\u2581world", "<0x20>", "<0xC3>", "<0xA9>"]


def test_a_sentencepiece_only_continuation_keeps_its_first_tokens_leading_space(sentencepiece_tokenizer) -> None:
    tok = sentencepiece_tokenizer
    prompt, ids = tok.encode("how are you"), tok.convert_tokens_to_ids(SPM_REPLY)
    continued = tok.decode(prompt + ids)[len(tok.decode(prompt)):]
    assert continued == " hello😀 world é"
    for stop in ((), ("zz",)):
        pieces, _ = feed(StopMatcher(tok, stop=stop, max_tokens=len(ids), keep_leading_space=True), ids)
        assert "".join(pieces) == continued


def test_a_sentencepiece_only_stream_is_its_full_decode(sentencepiece_tokenizer) -> None:
    # mlx-lm's naive detokenizer trims the decoded text's trailing space, then emits it again: "world  é"
    tok = sentencepiece_tokenizer
    ids = tok.convert_tokens_to_ids(SPM_REPLY)
    for stop in ((), ("zz",)):
        pieces, reason = feed(StopMatcher(tok, stop=stop, max_tokens=len(ids)), ids)
        assert ("".join(pieces), reason) == (tok.decode(ids), "length")
        assert all("\ufffd" not in p for p in pieces)
    pieces, reason = feed(StopMatcher(tok, stop=[" é"], max_tokens=len(ids)), ids)
    assert ("".join(pieces), reason) == ("hello😀 world", "stop")


def test_a_sentencepiece_reply_ending_inside_a_character_writes_none_of_it(sentencepiece_tokenizer) -> None:
    tok = sentencepiece_tokenizer
    ids = tok.convert_tokens_to_ids(SPM_REPLY[:3])  # "hello" and two of "😀"'s bytes
    for stop in ((), ("zz",), ("\ufffd",)):
        pieces, reason = feed(StopMatcher(tok, stop=stop, max_tokens=len(ids)), ids)
        assert ("".join(pieces), reason) == ("hello", "length")


def test_a_sentencepiece_continuation_finishes_the_character_its_prompt_ends_inside(sentencepiece_tokenizer) -> None:
    tok = sentencepiece_tokenizer
    prompt = tok.encode("how are you") + tok.convert_tokens_to_ids(SPM_REPLY[:3])
    reply = tok.convert_tokens_to_ids(SPM_REPLY[3:6])  # the rest of "😀", then "▁world"
    assert tok.decode(prompt + reply).endswith("hello😀 world")
    for stop in ((), ("zz",)):
        pieces, _ = feed(StopMatcher(tok, stop=stop, max_tokens=len(reply), keep_leading_space=True,
                                     continued=prompt), reply)
        assert "".join(pieces) == "😀 world"


def test_mlx_lms_sentencepiece_detokenizer_trims_a_replys_first_space_but_a_continuations(sentencepiece_tokenizer,
                                                                                           monkeypatch) -> None:
    # A tokenizer.json with SentencePiece's decoder: its decode drops the "▁" a reply starts with, as mlx-lm's
    # detokenizer does (a continuation keeps it); a character left unfinished is dropped, or finished across.
    from mlx_lm.tokenizer_utils import SPMStreamingDetokenizer

    tok = sentencepiece_tokenizer
    monkeypatch.setattr(tok, "_detokenizer", SPMStreamingDetokenizer(tok))
    ids = tok.convert_tokens_to_ids(SPM_REPLY)
    for stop in ((), ("zz",)):
        assert "".join(feed(StopMatcher(tok, stop=stop, max_tokens=len(ids)), ids)[0]) == "hello😀 world é"
        continued, _ = feed(StopMatcher(tok, stop=stop, max_tokens=len(ids), keep_leading_space=True), ids)
        assert "".join(continued) == " hello😀 world é"
        cut, reason = feed(StopMatcher(tok, stop=(*stop, "\ufffd"), max_tokens=3), ids)
        assert ("".join(cut), reason) == ("hello", "length")
        prompt = tok.encode("how are you") + ids[:3]
        finished, _ = feed(StopMatcher(tok, stop=stop, max_tokens=3, keep_leading_space=True, continued=prompt),
                           ids[3:6])
        assert "".join(finished) == "😀 world"


def test_a_sentencepiece_only_position_counts_a_space_held_for_cleaning_up(sentencepiece_tokenizer, monkeypatch) -> None:
    # A tokenizer that cleans up " ," may drop a trailing space: it waits for the next token, which starts after it
    tok = sentencepiece_tokenizer
    monkeypatch.setattr(tok._detokenizer, "_clean_spaces", True)
    ids = tok.convert_tokens_to_ids(["\u2581hello", "<0x20>", "\u2581world"])
    m = StopMatcher(tok, stop=["zz"], max_tokens=len(ids), keep_leading_space=True)
    starts, pieces = [], []
    for t in ids:
        starts.append(m.position())
        pieces.append(m.add(t).text)
    assert (starts, pieces) == ([0, 6, 7], [" hello", "", "  world"])


def test_special_tokens_written_mid_reply_are_left_out_of_its_text_unless_asked_for(tiny_loaded) -> None:
    # SmolLM2 ends with <|im_end|> but may write <|endoftext|> or <|im_start|> before it: markup, shown as content.
    tok = tiny_loaded.tokenizer
    ids = tok.encode("Hi", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|endoftext|>")] + \
        tok.encode(" there", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_start|>")]
    pieces, reason = feed(StopMatcher(tok, max_tokens=len(ids)), ids)
    assert ("".join(pieces), reason) == ("Hi there", "length")
    pieces, _ = feed(StopMatcher(tok, stop=["zz"], max_tokens=len(ids)), ids)  # the path that holds text back
    assert "".join(pieces) == "Hi there"
    pieces, _ = feed(StopMatcher(tok, max_tokens=len(ids), skip_special_tokens=False), ids)
    assert "".join(pieces) == "Hi<|endoftext|> there<|im_start|>"


def test_the_tokens_a_replys_markers_are_made_of_are_never_hidden(tiny_loaded, monkeypatch) -> None:
    from engine import special_tokens

    tok = tiny_loaded.tokenizer
    start = tok.convert_tokens_to_ids("<|im_start|>")
    assert start in special_tokens._hidden(tok)
    monkeypatch.setattr(type(tok), "think_start", "<|im_start|>", raising=False)  # a model whose think tag is special
    monkeypatch.setattr(type(tok), "think_end", "</x>", raising=False)
    assert start not in special_tokens._hidden(tok)


def test_ids_past_the_tokenizers_vocabulary_have_no_text(tiny_loaded) -> None:
    # A vocab_size padded past the tokenizer (Qwen's 151,936 for 151,665 tokens): mlx-lm's detokenizer wrote "!".
    tok = tiny_loaded.tokenizer
    ids = tok.encode("Hi", add_special_tokens=False) + [len(tok) + 5] + tok.encode(" there", add_special_tokens=False)
    pieces, _ = feed(StopMatcher(tok, max_tokens=len(ids)), ids)
    assert "".join(pieces) == "Hi there"



@pytest.fixture
def marked_special(tiny_llm_dir, tmp_path) -> object:
    """The tiny model's tokenizer with SmolLM2's <file_sep> and <gh_stars>: special in tokenizer.json, but not among
    its named special tokens (bos, eos, pad, additional)."""
    from tests.fixtures.fim_tokenizers import with_added_tokens

    return with_added_tokens(tiny_llm_dir, tmp_path / "tok", ("<file_sep>", "<gh_stars>"))


def test_added_tokens_the_tokenizer_marks_special_are_left_out_as_transformers_skips_them(marked_special) -> None:
    # A reply biased into SmolLM2's <file_sep> showed it as content, whatever skip_special_tokens said.
    tok = marked_special
    ids = tok.encode("Hi", add_special_tokens=False) + [tok.convert_tokens_to_ids("<file_sep>")] + \
        tok.encode(" there", add_special_tokens=False) + [tok.convert_tokens_to_ids("<gh_stars>")]
    assert tok.convert_tokens_to_ids("<file_sep>") not in tok.all_special_ids
    pieces, _ = feed(StopMatcher(tok, max_tokens=len(ids)), ids)
    assert "".join(pieces) == tok._tokenizer.decode(ids, skip_special_tokens=True) == "Hi there"
    pieces, _ = feed(StopMatcher(tok, max_tokens=len(ids), skip_special_tokens=False), ids)
    assert "".join(pieces) == "Hi<file_sep> there<gh_stars>"


def test_a_tool_call_formats_special_tokens_stay_in_the_text(marked_special, monkeypatch) -> None:
    # A family whose calls carry special tokens inside (Mistral's [ARGS], Kimi's <|tool_call_begin|>): its parser reads
    # them from the text, so only the named special tokens are left out.
    from engine import special_tokens

    tok = marked_special
    file_sep = tok.convert_tokens_to_ids("<file_sep>")
    assert file_sep in special_tokens._hidden(tok)
    monkeypatch.setattr(type(tok), "tool_parser", lambda text, tools: None, raising=False)
    monkeypatch.setattr(type(tok), "tool_call_start", "<gh_stars>", raising=False)
    monkeypatch.setattr(type(tok), "tool_call_end", "", raising=False)
    assert file_sep not in special_tokens._hidden(tok)
