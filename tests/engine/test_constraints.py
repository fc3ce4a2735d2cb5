"""engine.constraints: a reply asked to follow a JSON schema follows it, token by token, through the engine's
batching (beside unconstrained rows) exactly as a one-row loop masking each step gives it; a thinking block first."""

from __future__ import annotations

import json
import re

import anyio
import mlx.core as mx
import pytest

from engine.constraints import (ConstraintError, ConstraintTokenizer, ParametersError, call_grammar, json_grammar,
                                marker, regex_grammar)
from engine.contracts import GenerationRequest, GrammarSpec, SamplingParams
from engine.runtime import Engine

pytestmark = pytest.mark.anyio

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "n", "color"],
          "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99},
                         "color": {"enum": ["red", "green", "blue"]}}}


def prompt_of(length: int, salt: int) -> list[int]:
    return [3 + (salt * 31 + i * 17) % 390 for i in range(length)]


def reference(loaded, prompt: list[int], grammar: GrammarSpec, n: int) -> list[int]:
    """One row, no batching: the model's logits, masked, argmax; the matcher advanced by each token."""
    from mlx_lm.models.cache import make_prompt_cache

    constraint = ConstraintTokenizer(loaded.tokenizer, loaded.model.args.vocab_size).constraint(grammar)
    cache = make_prompt_cache(loaded.model)
    logits = loaded.model(mx.array([prompt]), cache=cache)[:, -1]
    out: list[int] = []
    eos = set(loaded.tokenizer.eos_token_ids)
    while len(out) < n:
        mask = constraint.mask()
        if mask is not None:
            logits = mx.where(mask, logits, -mx.inf)
        token = int(mx.argmax(logits, axis=-1).item())
        out.append(token)
        if token in eos:
            break
        constraint.accept(token)
        logits = loaded.model(mx.array([[token]]), cache=cache)[:, -1]
    return out


async def _run(engine: Engine, requests: list[GenerationRequest]) -> list[tuple[list[int], str, str | None]]:
    results: dict[int, tuple[list[int], str, str | None]] = {}

    async def consume(i: int) -> None:
        ids: list[int] = []
        text = ""
        finish = None
        async with engine.submit(requests[i]) as stream:
            async for delta in stream:
                ids += delta.token_ids
                text += delta.text
                finish = delta.finish_reason or finish
        results[i] = (ids, text, finish)

    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.serve)
        async with anyio.create_task_group() as clients:
            for i in range(len(requests)):
                clients.start_soon(consume, i)
        engine.close()
    return [results[i] for i in range(len(requests))]


async def test_a_schema_is_followed_beside_plain_rows_as_one_row_alone(tiny_loaded) -> None:
    grammar = GrammarSpec(json_grammar(SCHEMA))
    greedy = SamplingParams(temperature=0.0)
    constrained = SamplingParams(temperature=0.0, grammar=grammar)
    requests = [GenerationRequest(prompt_of(9, 1), constrained, max_tokens=60),
                GenerationRequest(prompt_of(5, 2), greedy, max_tokens=20),
                GenerationRequest(prompt_of(14, 3), constrained, max_tokens=60),
                GenerationRequest(prompt_of(7, 4), SamplingParams(temperature=0.8, grammar=grammar), max_tokens=60)]
    out = await _run(Engine(tiny_loaded, max_active=4, max_iteration_tokens=8), requests)
    for (ids, text, finish), request in zip(out[:3:2], requests[:3:2]):
        reply = json.loads(text)  # the random-init model writes valid JSON of the schema, and stops there
        assert set(reply) == {"ok", "n", "color"} and reply["color"] in ("red", "green", "blue") and finish == "stop"
        assert ids == reference(tiny_loaded, request.prompt_tokens, grammar, 60)
    assert out[1][0] != [] and not out[1][1].startswith("{")  # the plain row is not constrained
    assert set(json.loads(out[3][1])) == {"ok", "n", "color"}  # sampled, within the mask


def test_json_object_mode_opens_an_object(tiny_loaded) -> None:
    # response_format {"type": "json_object"}: any JSON object, so its first token opens one.
    vocab = tiny_loaded.model.args.vocab_size
    constraint = ConstraintTokenizer(tiny_loaded.tokenizer, vocab).constraint(GrammarSpec(json_grammar(None)))
    allowed = {i for i, ok in enumerate(constraint.mask()[0].tolist()) if ok}
    texts = {tiny_loaded.tokenizer.decode([i]) for i in allowed}
    assert "{" in texts and all(t.startswith("{") for t in texts), texts


async def test_a_thinking_block_comes_first(tiny_loaded) -> None:
    # Constrained only once the reply wrote its opening: before it, the model's own tokens.
    text = json_grammar(SCHEMA)
    prompt = prompt_of(9, 5)
    free = reference(tiny_loaded, prompt, GrammarSpec(text, after=(-1,)), 4)  # never opens: unconstrained
    grammar = GrammarSpec(text, after=tuple(free[1:3]))
    ids = (await _run(Engine(tiny_loaded), [GenerationRequest(
        prompt, SamplingParams(temperature=0.0, grammar=grammar), max_tokens=60)]))[0][0]
    assert ids[:3] == free[:3] and ids == reference(tiny_loaded, prompt, grammar, 60)
    assert ids[3:] != free[3:4]
    reply = tiny_loaded.tokenizer.decode(ids[3:], skip_special_tokens=True)
    assert set(json.loads(reply)) == {"ok", "n", "color"}


async def test_a_tool_calls_marker_frees_the_reply(tiny_loaded) -> None:
    # Beside tools the call's opening token may come instead of the JSON; once it has, the call is the model's own.
    text = json_grammar(SCHEMA)
    prompt = prompt_of(11, 6)
    free = reference(tiny_loaded, prompt, GrammarSpec(text, after=(-1,)), 12)
    escaped = GrammarSpec(text, escape=free[0])  # the model's own first token stands for the marker
    ids = (await _run(Engine(tiny_loaded), [GenerationRequest(
        prompt, SamplingParams(temperature=0.0, grammar=escaped), max_tokens=12)]))[0][0]
    assert ids == free == reference(tiny_loaded, prompt, escaped, 12)
    constrained = reference(tiny_loaded, prompt, GrammarSpec(text, escape=None), 12)
    assert constrained[0] != free[0]  # without the escape the first token is the JSON's


async def test_strict_calls_follow_their_functions_schemas(tmp_path) -> None:
    # OpenAI's strict function calling: once a call opens, its name is a declared function's and its arguments
    # follow that function's parameters; calls may follow one another, then the reply ends.
    from tests.fixtures.tiny_llm import build_tiny_llm, load_tiny_llm

    loaded = load_tiny_llm(build_tiny_llm(tmp_path / "m", extra_special_tokens=("<tool_call>", "</tool_call>")))
    vocab = loaded.tokenizer._tokenizer.get_vocab()
    opening, closing = vocab["<tool_call>"], vocab["</tool_call>"]
    weather = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
               "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1,
                                                                            "maximum": 7}}}
    calls = call_grammar([("get_weather", weather, True), ("noop", {"type": "object", "properties": {},
                                                                    "additionalProperties": False}, True)],
                         opening=marker("<tool_call>", [opening]), closing=marker("</tool_call>", [closing]))
    prompt = prompt_of(10, 7)
    free = reference(loaded, prompt, GrammarSpec(None, after=(-1,), calls=calls), 3)
    grammar = GrammarSpec(None, after=(free[0],), calls=calls)  # the model's own first token opens the call here
    ids = (await _run(Engine(loaded), [GenerationRequest(
        prompt, SamplingParams(temperature=0.0, grammar=grammar), max_tokens=120)]))[0][0]
    assert ids[0] == free[0] and ids == reference(loaded, prompt, grammar, 120)
    text = loaded.tokenizer.decode(ids[1:])
    bodies = re.findall(r"(?:^|<tool_call>)\s*(.*?)\s*</tool_call>", text)
    assert bodies and re.fullmatch(r"(\s*(<tool_call>)?\s*\{.*?\}\s*</tool_call>)+\s*(<tool_call>.*)?(<\|im_end\|>)?",
                                   text, re.S), text
    for body in bodies:
        call = json.loads(body)
        assert call["name"] in ("get_weather", "noop")
        if call["name"] == "get_weather":
            assert call["arguments"]["city"] in ("Paris", "Oslo") and 1 <= call["arguments"]["days"] <= 7
        else:
            assert call["arguments"] == {}


@pytest.mark.parametrize("schema, words", [
    ({"type": 5}, "type must be a string"),
    ({"$ref": "#/nowhere"}, "does not exist"),
    ({"type": "string", "format": "no-such-format"}, "Unknown format"),
])
def test_a_schema_that_cannot_be_enforced_is_refused(schema, words: str) -> None:
    with pytest.raises(ConstraintError, match=words):
        json_grammar(schema)


async def test_a_grammar_that_fails_mid_reply_ends_its_row_alone(tiny_loaded) -> None:
    # A schema whose every object must nest another passes its first mask, then the parser gives up: that failure
    # failed every row of the step (and showed them the schema). Its row ends in error; the others go on.
    nesting = GrammarSpec(json_grammar({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}))
    requests = [GenerationRequest(prompt_of(9, 1), SamplingParams(temperature=0.0, grammar=nesting), max_tokens=40),
                GenerationRequest(prompt_of(5, 2), SamplingParams(temperature=0.0), max_tokens=20),
                GenerationRequest(prompt_of(7, 3), SamplingParams(temperature=0.0, grammar=GrammarSpec(
                    json_grammar(SCHEMA))), max_tokens=60)]
    failed, plain, fine = await _run(Engine(tiny_loaded, max_active=4), requests)
    assert failed[2] == "error" and failed[1].startswith("{")
    assert plain[2] == "length" and plain[0] == reference(tiny_loaded, requests[1].prompt_tokens,
                                                          GrammarSpec(None, after=(-1,)), 20)
    assert fine[2] == "stop" and set(json.loads(fine[1])) == {"ok", "n", "color"}


def test_a_grammar_is_built_once_and_refused_before_any_reply_when_it_admits_nothing(
        tiny_loaded, monkeypatch: pytest.MonkeyPatch) -> None:
    # Built on the event loop at submit, a large schema's lexer held every stream for seconds.
    import engine.constraints as constraints

    tokenizer = ConstraintTokenizer(tiny_loaded.tokenizer, tiny_loaded.model.args.vocab_size)
    spec = GrammarSpec(json_grammar(SCHEMA))
    tokenizer.prepare(spec)  # the service's worker thread: the event loop only copies what it built
    built: list[str] = []
    original = constraints._matcher
    monkeypatch.setattr(constraints, "_matcher", lambda *args: built.append("x") or original(*args))
    first, second = tokenizer.constraint(spec), tokenizer.constraint(spec)
    assert built == [] and first._matcher is not second._matcher  # a copy a row
    with pytest.raises(ConstraintError):  # only itself, forever: no JSON text at all
        tokenizer.prepare(GrammarSpec(json_grammar({"$ref": "#"})))


async def test_a_model_may_think_before_its_constrained_answer(tiny_loaded) -> None:
    # Qwen3 and SmolLM3 open the block themselves: a schema forbade it, switching their thinking off unasked.
    text = json_grammar(SCHEMA)
    prompt = prompt_of(13, 8)
    free = reference(tiny_loaded, prompt, GrammarSpec(text, after=(-1,)), 3)
    grammar = GrammarSpec(text, think=(free[0], free[2]))  # the model's own first and third tokens stand in
    ids = (await _run(Engine(tiny_loaded), [GenerationRequest(
        prompt, SamplingParams(temperature=0.0, grammar=grammar), max_tokens=60)]))[0][0]
    assert ids[:3] == free and ids == reference(tiny_loaded, prompt, grammar, 60)
    answer = tiny_loaded.tokenizer.decode(ids[3:], skip_special_tokens=True)
    assert set(json.loads(answer)) == {"ok", "n", "color"}
    unthinking = reference(tiny_loaded, prompt, GrammarSpec(text), 60)
    assert unthinking[0] != free[0]  # without it the first token is the answer's


async def test_a_forced_call_opens_the_reply(tmp_path) -> None:
    # tool_choice "required" / a named function (pydantic-ai's tool output, LangChain's function_calling, instructor's
    # TOOLS): the reply is the named function's call from its first token, the marker written by the grammar.
    from tests.fixtures.tiny_llm import build_tiny_llm, load_tiny_llm

    loaded = load_tiny_llm(build_tiny_llm(tmp_path / "m", extra_special_tokens=("<tool_call>", "</tool_call>")))
    vocab = loaded.tokenizer._tokenizer.get_vocab()
    calls = call_grammar([("answer", {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                                      "additionalProperties": False}, True)],
                         opening=marker("<tool_call>", [vocab["<tool_call>"]]),
                         closing=marker("</tool_call>", [vocab["</tool_call>"]]), opened=False)
    grammar = GrammarSpec(None, calls=calls)
    prompt = prompt_of(10, 9)
    ids = (await _run(Engine(loaded), [GenerationRequest(
        prompt, SamplingParams(temperature=0.0, grammar=grammar), max_tokens=80)]))[0][0]
    assert ids[0] == vocab["<tool_call>"] and ids == reference(loaded, prompt, grammar, 80)
    body = re.match(r"\s*(.*?)\s*</tool_call>", loaded.tokenizer.decode(ids[1:]), re.S)
    assert body is not None and json.loads(body[1])["name"] == "answer"
    assert isinstance(json.loads(body[1])["arguments"]["ok"], bool)


def test_a_call_marker_written_as_text_is_found_in_the_text(tiny_loaded) -> None:
    # A model told its tools in the prompt writes "<tool_call>" in several tokens that may merge with what precedes
    # it: strict calls went unenforced. The grammar finds the marker in the text and constrains the call after it.
    tokenizer = tiny_loaded.tokenizer
    calls = call_grammar([("get_weather", {"type": "object", "properties": {"city": {"enum": ["Paris"]}},
                                           "required": ["city"], "additionalProperties": False}, True)],
                         opening=marker("<tool_call>", [1, 2]), closing=marker("</tool_call>", [1, 2]),
                         free_text="<tool_call>")
    constraint = ConstraintTokenizer(tokenizer, tiny_loaded.model.args.vocab_size).constraint(GrammarSpec(None,
                                                                                                          calls=calls))
    free = constraint.mask()
    assert free is not None  # free text first: any text (valid UTF-8: a lone continuation byte is not)
    assert all(bool(free[0, t]) for t in tokenizer.encode("Hello world! This is", add_special_tokens=False))
    for token in tokenizer.encode('Sure.<tool_call>\n{"name": "get_', add_special_tokens=False):
        constraint.accept(token)
    allowed = [tokenizer.decode([i]) for i, ok in enumerate(constraint.mask()[0].tolist()) if ok]
    assert allowed and all("weather".startswith(t) or t.startswith("weather") for t in allowed), allowed


async def test_a_regex_grammar_is_matched_whole_beside_a_plain_row(tiny_loaded) -> None:
    # TGI's response_format {"type": "regex", "value": ...} (huggingface_hub's InferenceClient sends it): the reply is
    # text the pattern matches, sampled or greedy, and it ends when nothing more can match.
    pattern = r"(yes|no), [0-9]{2,3}!"
    grammar = GrammarSpec(regex_grammar(pattern))
    requests = [GenerationRequest(prompt_of(9, 10), SamplingParams(temperature=0.0, grammar=grammar), max_tokens=30),
                GenerationRequest(prompt_of(6, 11), SamplingParams(temperature=0.0), max_tokens=12),
                GenerationRequest(prompt_of(8, 12), SamplingParams(temperature=1.0, seed=3, grammar=grammar),
                                  max_tokens=30)]
    greedy, plain, sampled = await _run(Engine(tiny_loaded), requests)
    assert greedy[0] == reference(tiny_loaded, requests[0].prompt_tokens, grammar, 30)
    for ids, text, finish in (greedy, sampled):
        assert finish == "stop" and re.fullmatch(pattern, text), text
    assert not re.fullmatch(pattern, plain[1])


@pytest.mark.parametrize("pattern, words", [("(", "unclosed group"), ("[z-a]", "invalid character class range")])
def test_a_pattern_that_does_not_parse_is_refused_saying_why(pattern: str, words: str) -> None:
    with pytest.raises(ConstraintError, match=f"the pattern cannot be enforced: {words}"):
        regex_grammar(pattern)


def _follows(tiny_loaded, grammar: str, text: str) -> bool:
    """Whether the grammar's matcher takes the whole of `text` and may end there."""
    from llguidance import LLMatcher

    tokenizer = ConstraintTokenizer(tiny_loaded.tokenizer, tiny_loaded.model.args.vocab_size).get()
    matcher = LLMatcher(tokenizer, grammar)
    tokens = tiny_loaded.tokenizer.encode(text, add_special_tokens=False)
    return matcher.try_consume_tokens(tokens) == len(tokens) and matcher.is_accepting()


PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
          "additionalProperties": False}
COUNT = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}


@pytest.mark.parametrize("functions, good, bad", [
    # Pydantic's nested model (instructor's TOOLS, create_iterable; openai-agents' and pydantic-ai's strict tools)
    ([("f", {"$defs": {"P": PERSON}, "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "required": ["p"],
             "additionalProperties": False})], ("f", {"p": {"name": "x"}}), ("f", {"p": {"n": 1}})),
    ([("f", {"definitions": {"P": PERSON}, "type": "array", "items": {"$ref": "#/definitions/P"}})],
     ("f", [{"name": "x"}]), ("f", [{"name": 1}])),
    ([("f", {"$defs": {"a/b~c": PERSON}, "$ref": "#/$defs/a~1b~0c"})], ("f", {"name": "x"}), ("f", {})),
    ([("f", {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
             "required": ["next"], "additionalProperties": False})],
     ("f", {"next": {"next": None}}), ("f", {"next": 5})),
    # each function's refs resolve within its own schema, one name in both
    ([("f", {"$defs": {"P": PERSON}, "$ref": "#/$defs/P"}), ("g", {"$defs": {"P": COUNT}, "$ref": "#/$defs/P"})],
     ("g", {"n": 1}), ("g", {"name": "x"})),
    # a schema with its own $id is its own resource: its refs resolved against it already
    ([("f", {"$id": "urn:f", "$defs": {"P": PERSON}, "$ref": "#/$defs/P"})], ("f", {"name": "x"}), ("f", {"n": 1})),
])
def test_a_functions_local_refs_resolve_within_its_own_parameters(tiny_loaded, functions, good, bad) -> None:
    # Embedded in the calls' schema, "#/$defs/P" was looked up from its root: every such forced or strict call was
    # refused ("Pointer '/$defs/P' does not exist").
    functions = [(name, schema, True) for name, schema in functions]  # each strict: its schema exactly
    sent = json.dumps(functions)
    grammar = call_grammar(functions, opening='"<tool_call>"', closing='"</tool_call>"')
    assert json.dumps(functions) == sent  # the caller's schemas are not rewritten in place

    def call(name: str, arguments) -> str:
        return json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"

    assert _follows(tiny_loaded, grammar, call(*good)) and not _follows(tiny_loaded, grammar, call(*bad))


UNIQUE = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
          "required": ["tags"], "additionalProperties": False}
UNLISTED = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"], "additionalProperties": False}


@pytest.mark.parametrize("functions, at, words", [
    ([("f", UNIQUE, False), ("g", UNIQUE, True)], 1, "Unimplemented keys"),  # one `lenient` for all: ignored
    # llguidance dropped the branch: never called; its own words blamed the call's "arguments", not the name "b"
    ([("f", COUNT, True), ("g", UNLISTED, False)], 1, "`required` names 'b', which `properties` does not list"),
    ([("f", UNLISTED, True), ("g", COUNT, True)], 0, "`required` names 'b'"),
])
def test_each_functions_parameters_are_compiled_on_their_own_terms(functions, at: int, words: str) -> None:
    with pytest.raises(ParametersError, match=words) as caught:
        call_grammar(functions, opening='"<tool_call>"', closing='"</tool_call>"')
    assert caught.value.function == at and caught.value.message.startswith(f"tool {functions[at][0]!r}: ")


def test_a_strict_function_beside_one_not_strict_is_enforced_exactly_and_the_other_leniently(tiny_loaded) -> None:
    grammar = call_grammar([("f", COUNT, True), ("g", UNIQUE, False)], opening='"<tool_call>"',
                           closing='"</tool_call>"')

    def follows(name: str, arguments) -> bool:
        return _follows(tiny_loaded, grammar, json.dumps({"name": name, "arguments": arguments}) + "</tool_call>")

    assert follows("f", {"n": 1}) and not follows("f", {"n": 1, "m": 2}) and not follows("f", {"n": "1"})
    assert follows("g", {"tags": ["a", "a"]}) and not follows("g", {"tags": [1]})  # uniqueItems ignored, not types


def test_a_response_formats_local_refs_resolve_and_a_url_ref_is_refused(tiny_loaded) -> None:
    schema = {"$defs": {"P": PERSON}, "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "required": ["p"],
              "additionalProperties": False}
    grammar = json_grammar(schema)
    assert _follows(tiny_loaded, grammar, '{"p": {"name": "x"}}') and not _follows(tiny_loaded, grammar, '{"p": 1}')
    with pytest.raises(ConstraintError, match="not present in a registry"):
        call_grammar([("f", {"$ref": "https://example.com/p.json"}, True)], opening='"<a>"', closing='"</a>"')


@pytest.mark.parametrize("schema", [
    {"$ref": "#"},  # the parameters are themselves, and nothing else
    {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "$defs": {"A": {"$ref": "#/$defs/A"}}},
    {"type": "object", "properties": {"a": {"$ref": "#/$defs/A", "description": "a"}},
     "$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}},
])
def test_a_cycle_of_refs_that_never_reaches_a_schema_is_refused_up_front(schema) -> None:
    # Taken before: the call constrained nothing ({"f": {"f": ... until max_tokens) or failed mid-reply with
    # llguidance's "NoExtensionBias".
    with pytest.raises(ConstraintError, match="cycle of \\$refs"):
        call_grammar([("f", schema, True)], opening='"<tool_call>"', closing='"</tool_call>"')
    with pytest.raises(ConstraintError, match="cycle of \\$refs"):
        json_grammar(schema)


def test_a_recursive_schema_that_reaches_one_is_taken() -> None:
    tree = {"type": "object", "properties": {"name": {"type": "string"}, "child": {"$ref": "#"}}, "required": ["name"]}
    listed = {"type": "object", "properties": {"n": {"$ref": "#/$defs/N"}},
              "$defs": {"N": {"$ref": "#/$defs/M"},
                        "M": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}}}}}
    for schema in (tree, listed):
        call_grammar([("f", schema, True)], opening='"<tool_call>"', closing='"</tool_call>"')
        json_grammar(schema)


def test_a_forced_calls_string_may_hold_the_end_markers_text_and_the_call_ends_at_the_real_one(tiny_loaded) -> None:
    # SmolLM2 writes its markers as text: the grammar let a forced call's string hold "</tool_call>", and the reply's
    # splitter ended the call there (arguments cut mid-string, finish_reason "tool_calls"). The call ends where its
    # JSON does.
    from mlx_lm.tool_parsers import json_tools

    from engine.chat_output import ChatOutputSplitter, OutputMarkers
    from tests.fixtures.output_events import joined_calls

    calls = call_grammar([("f", {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"],
                                 "additionalProperties": False}, True)],
                         opening=marker("<tool_call>", [1, 2]), closing=marker("</tool_call>", [1, 2]), opened=False)
    reply = '<tool_call>{"name": "f", "arguments": {"a": "100}}</tool_call>"}}</tool_call>'
    assert _follows(tiny_loaded, calls, reply)
    splitter = ChatOutputSplitter(OutputMarkers(tool_call_start=json_tools.tool_call_start,
                                                tool_call_end=json_tools.tool_call_end,
                                                tool_parser=json_tools.parse_tool_call),
                                  tools=[{"type": "function", "function": {"name": "f"}}], forced_name="f")
    pieces = tiny_loaded.tokenizer.encode(reply, add_special_tokens=False)
    events = [e for token in pieces for e in splitter.feed(tiny_loaded.tokenizer.decode([token]))] + splitter.finish()
    assert [(name, json.loads(arguments)) for name, arguments in joined_calls(events)] == \
        [("f", {"a": "100}}</tool_call>"})]
