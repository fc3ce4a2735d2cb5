"""service/chat/structured_outputs.py: vLLM's `structured_outputs` and its older top-level `guided_*` spellings on chat
and text completions — a reply that is one of the choices, matches the pattern, follows the schema or the grammar
(Guidance's body, both spellings at once), enforced by the real engine; two different constraints, and what is not
served, are a 400 naming the field."""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

import pytest
from litestar.testing import TestClient

from engine.constraints import choice_grammar, json_grammar, lark_grammar, regex_grammar
from service.app import create_app
from service.state import AppState
from tests.service.conftest import sse_events
from tests.service.fake_engine import FakeEngine

USER = [{"role": "user", "content": "Answer."}]
CHAT, TEXT = "/v1/chat/completions", "/v1/completions"
ROUTES = [(CHAT, {"messages": USER}), (TEXT, {"prompt": "Answer:"})]
# Guidance 0.3.1's grammar for select(["yes", "no"]), as its vLLM backend sends it (llguidance's Lark).
GUIDANCE_GRAMMAR = '%llguidance {}\n\nstart: a\na[capture]: A\n\nA: "yes"\n     | "no"\n\n'
# The same as xgrammar's GBNF (llama.cpp's EBNF), which vLLM's guidance backend converts too.
GBNF = 'root ::= "yes" | "no"'
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "n", "color"],
          "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99},
                         "color": {"enum": ["red", "green", "blue"]}}}


@pytest.fixture
def real(tiny_loaded: Any) -> Iterator[TestClient[Any]]:
    """The app around the tiny model's real engine: its sampler masks by the grammar."""
    from engine.runtime import Engine

    with TestClient(create_app(AppState(engine=Engine(tiny_loaded, max_iteration_tokens=8)))) as client:
        yield client


def _reply(client: TestClient[Any], path: str, body: dict[str, Any]) -> list[str]:
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert all(c["finish_reason"] == "stop" for c in choices), choices  # the grammar ended them, not max_tokens
    return [c["message"]["content"] if path == CHAT else c["text"] for c in choices]


def test_guidances_vllm_body_is_answered_with_one_of_its_choices(real: TestClient[Any]) -> None:
    # guidance.models.experimental.VLLMModel streams a text completion, its grammar in vLLM's old and new spellings
    # at once: a 400 "Unrecognized request argument supplied: structured_outputs" failed every select/gen/json.
    body = {"prompt": "<|im_start|>user\nYes or no?<|im_end|>\n<|im_start|>assistant\n",
            "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.0, "max_tokens": 512,
            "guided_decoding_backend": "guidance", "guided_grammar": GUIDANCE_GRAMMAR,
            "structured_outputs": {"grammar": GUIDANCE_GRAMMAR}}
    response = real.post(TEXT, json=body)
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    text = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
    assert events[-1] == "[DONE]" and text in ("yes", "no"), events
    assert [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"]][-1] == "stop"
    # Its chat models send the same fields beside messages.
    chat = {"messages": USER, "max_tokens": 512, "guided_decoding_backend": "guidance",
            "guided_grammar": GUIDANCE_GRAMMAR, "structured_outputs": {"grammar": GUIDANCE_GRAMMAR}}
    assert _reply(real, CHAT, chat)[0] in ("yes", "no")
    assert _reply(real, TEXT, {"prompt": "Yes or no?", "structured_outputs": {"grammar": GBNF}})[0] in ("yes", "no")


@pytest.mark.parametrize("path, body", ROUTES)
@pytest.mark.parametrize("asked", [{"structured_outputs": {"choice": ["red car", "blue", "naïve \"x\""]}},
                                   {"guided_choice": ["red car", "blue", "naïve \"x\""]}])
def test_a_choice_constraint_replies_with_one_of_the_choices(real: TestClient[Any], path: str, body: dict[str, Any],
                                                             asked: dict[str, Any]) -> None:
    # sampled (a random model's likeliest text is none of them), three choices each
    replies = _reply(real, path, {**body, **asked, "n": 3, "seed": 7, "temperature": 1.0, "max_tokens": 64})
    assert len(replies) == 3 and set(replies) <= {"red car", "blue", "naïve \"x\""}, replies


@pytest.mark.parametrize("path, body", ROUTES)
@pytest.mark.parametrize("field", ["structured_outputs", "guided_regex"])
def test_a_regex_constraint_is_matched_whole(real: TestClient[Any], path: str, body: dict[str, Any],
                                             field: str) -> None:
    pattern = r"[0-9]{3}-[a-c]{2}(!|\?)"
    asked = {"structured_outputs": {"regex": pattern}} if field == "structured_outputs" else {field: pattern}
    reply = _reply(real, path, {**body, **asked, "temperature": 1.0, "seed": 3, "max_tokens": 64})[0]
    assert re.fullmatch(pattern, reply), reply


@pytest.mark.parametrize("path, body", ROUTES)
@pytest.mark.parametrize("asked", [{"structured_outputs": {"json": SCHEMA}}, {"guided_json": json.dumps(SCHEMA)},
                                   {"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}}])
def test_a_json_schema_constraint_is_followed(real: TestClient[Any], path: str, body: dict[str, Any],
                                              asked: dict[str, Any]) -> None:
    reply = _reply(real, path, {**body, **asked, "temperature": 0, "max_tokens": 200})[0]
    value = json.loads(reply)
    assert set(value) == {"ok", "n", "color"} and isinstance(value["ok"], bool) and 0 <= value["n"] <= 99
    assert value["color"] in ("red", "green", "blue")
    compact = asked.get("structured_outputs", {}).get("disable_any_whitespace")
    assert (" " not in reply) if compact else (", " in reply), reply  # else OpenAI's layout


def _grammar(client: TestClient[Any], fake_engine: FakeEngine, path: str, body: dict[str, Any]) -> str:
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    grammar = fake_engine.requests[-1].sampling.grammar
    assert grammar is not None and grammar.text is not None and fake_engine.prepared  # built off the event loop
    return grammar.text


@pytest.mark.parametrize("path, body", ROUTES)
def test_each_spelling_and_option_reaches_the_engine(client: Any, fake_engine: FakeEngine, path: str,
                                                     body: dict[str, Any]) -> None:
    def grammar(**asked: Any) -> str:
        return _grammar(client, fake_engine, path, {**body, **asked})

    assert grammar(guided_choice=["a", "b"]) == grammar(structured_outputs={"choice": ["a", "b"]}) == \
        choice_grammar(["a", "b"])
    assert grammar(guided_regex="x+") == grammar(structured_outputs={"regex": "x+", "backend": "xgrammar"}) == \
        regex_grammar("x+")
    assert grammar(guided_grammar=GUIDANCE_GRAMMAR, guided_decoding_backend="auto") == lark_grammar(GUIDANCE_GRAMMAR)
    assert grammar(structured_outputs={"grammar": GBNF}) == lark_grammar(GBNF)
    assert grammar(structured_outputs={"json_object": True}) == json_grammar(None, lenient=True)
    lenient = json_grammar({"type": "array", "uniqueItems": True}, lenient=True)  # as a schema not marked strict
    assert grammar(guided_json={"type": "array", "uniqueItems": True}) == lenient
    # JSON's layout options shape the schema's grammar; disable_additional_properties closes open objects.
    open_object = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert '"whitespace_pattern":"[ ]?"' in grammar(guided_json=open_object, guided_whitespace_pattern="[ ]?")
    assert '"item_separator":","' in grammar(structured_outputs={"json": open_object, "disable_any_whitespace": True})
    closed = grammar(structured_outputs={"json": open_object, "disable_additional_properties": True})
    assert '"additionalProperties":false' in closed and '"additionalProperties"' not in grammar(guided_json=open_object)


def _refused(client: Any, path: str, body: dict[str, Any], param: str, *words: str) -> None:
    response = client.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and all(word in error["message"] for word in words), error


@pytest.mark.parametrize("path, body", ROUTES)
@pytest.mark.parametrize("asked, param, words", [
    ({"guided_regex": "x", "guided_choice": ["a"]}, "guided_regex", ("guided_choice", "guided_regex", "give one")),
    ({"guided_grammar": 'start: "a"', "structured_outputs": {"grammar": 'start: "b"'}}, "structured_outputs.grammar",
     ("guided_grammar and structured_outputs.grammar",)),
    ({"guided_json": {"type": "object"}, "structured_outputs": {"regex": "x"}}, "structured_outputs.regex",
     ("guided_json",)),
    ({"structured_outputs": {"regex": "x", "choice": ["a"]}}, "structured_outputs.regex",
     ("structured_outputs.choice and structured_outputs.regex",)),
    ({"structured_outputs": {}}, "structured_outputs", ("names no constraint",)),
    ({"structured_outputs": {"structural_tag": {"triggers": ["<f"]}}}, "structured_outputs.structural_tag",
     ("not supported",)),
    ({"structured_outputs": {"regex": "x", "disable_fallback": True}}, "structured_outputs.disable_fallback",
     ("Unrecognized request argument",)),
    ({"guided_regex": "x", "guided_decoding_backend": "lm-format-enforcer"}, "guided_decoding_backend",
     ("llguidance",)),
    ({"structured_outputs": {"regex": "x", "backend": "xgrammar:no-fallback"}}, "structured_outputs.backend", ()),
    ({"guided_regex": "x", "guided_whitespace_pattern": " "}, "guided_whitespace_pattern", ("JSON", "regex")),
    ({"structured_outputs": {"json": {}, "whitespace_pattern": " ", "disable_any_whitespace": True}},
     "structured_outputs.disable_any_whitespace", ("whitespace_pattern",)),
    ({"structured_outputs": {"json_object": False}}, "structured_outputs.json_object", ("only true",)),
    ({"guided_json": "{nope"}, "guided_json", ("not JSON",)),
    ({"structured_outputs": {"json": [1]}}, "structured_outputs.json", ("JSON Schema object",)),
    ({"guided_choice": []}, "guided_choice", ("at least 1",)),
    ({"structured_outputs": {"regex": "(yes"}}, "structured_outputs.regex", ("unclosed group",)),
    ({"guided_grammar": "start: nope"}, "guided_grammar", ("the grammar cannot be enforced", "nope")),
    ({"guided_json": {"type": 5}}, "guided_json", ("type must be a string",)),
])
def test_what_cannot_be_honoured_is_a_400_naming_the_field(client: Any, path: str, body: dict[str, Any],
                                                           asked: dict[str, Any], param: str,
                                                           words: tuple[str, ...]) -> None:
    _refused(client, path, {**body, **asked}, param, *words)


def test_response_format_beside_a_vllm_constraint_is_refused_naming_both(client: Any) -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    _refused(client, CHAT, {"messages": USER, "response_format": schema, "structured_outputs": {"regex": "x"}},
             "structured_outputs.regex", "response_format and structured_outputs.regex")
    _refused(client, CHAT, {"messages": USER, "response_format": {"type": "json_object"}, "guided_choice": ["a"]},
             "guided_choice", "response_format and guided_choice")
    # {"type": "text"} asks for nothing: the constraint stands alone.
    response = client.post(CHAT, json={"messages": USER, "response_format": {"type": "text"}, "guided_choice": ["a"]})
    assert response.status_code == 200, response.text


def test_on_a_continued_message_the_constraint_follows_the_continuation(client: Any, fake_engine: FakeEngine) -> None:
    # vLLM constrains what it generates: the prefill is the client's, the continuation follows the grammar (Guidance
    # continues an assistant turn so); response_format's JSON, a whole document, stays refused there.
    prefill = {"messages": [*USER, {"role": "assistant", "content": "The answer is "}],
               "continue_final_message": True, "add_generation_prompt": False}
    assert _grammar(client, fake_engine, CHAT, {**prefill, "guided_choice": ["yes", "no"]}) == \
        choice_grammar(["yes", "no"])
    _refused(client, CHAT, {**prefill, "response_format": {"type": "json_object"}}, "response_format")


def test_the_responses_route_takes_structured_outputs_as_vllms_does(real: TestClient[Any]) -> None:
    # vLLM's Responses body has structured_outputs (not the guided_* spellings); beside a JSON text.format, refused.
    response = real.post("/v1/responses", json={"input": "Yes or no?", "max_output_tokens": 64,
                                                "structured_outputs": {"choice": ["yes", "no"]}})
    assert response.status_code == 200, response.text
    assert response.json()["output"][-1]["content"][0]["text"] in ("yes", "no")
    both = {"input": "Hi", "structured_outputs": {"regex": "[0-9]+"},
            "text": {"format": {"type": "json_schema", "name": "s", "schema": SCHEMA}}}
    refused = real.post("/v1/responses", json=both)
    assert refused.status_code == 400 and "text.format" in refused.json()["error"]["message"], refused.text
    unknown = real.post("/v1/responses", json={"input": "Hi", "guided_choice": ["a"]})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "guided_choice"


@pytest.mark.parametrize("response_format", [
    {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA, "strict": True}},
    {"type": "json", "value": SCHEMA},  # TGI's, as huggingface_hub's InferenceClient sends it
])
def test_a_completion_takes_response_format_as_vllms_does(real: TestClient[Any],
                                                         response_format: dict[str, Any]) -> None:
    # vLLM's /v1/completions has response_format; it was refused here as an unknown field.
    reply = _reply(real, TEXT, {"prompt": "Answer:", "response_format": response_format, "temperature": 0,
                                "max_tokens": 200})[0]
    value = json.loads(reply)
    assert set(value) == {"ok", "n", "color"} and value["color"] in ("red", "green", "blue")


def test_a_completions_json_object_format_is_a_grammar(client: TestClient[Any], fake_engine: FakeEngine) -> None:
    body = {"prompt": "Hi", "response_format": {"type": "json_object"}}
    assert _grammar(client, fake_engine, TEXT, body) == json_grammar(None, lenient=True)
    client.post(TEXT, json={"prompt": "Hi", "response_format": {"type": "text"}})
    assert fake_engine.requests[-1].sampling.grammar is None


def test_a_completions_response_format_beside_structured_outputs_is_refused(real: TestClient[Any]) -> None:
    _refused(real, TEXT, {"prompt": "Hi", "response_format": {"type": "json_object"}, "guided_regex": "[0-9]+"},
             "guided_regex", "response_format and guided_regex")
    _refused(real, TEXT, {"prompt": "Hi", "response_format": {"type": "xml"}}, "response_format")
    strict = {"type": "json_schema", "json_schema": {"name": "s", "strict": True,
                                                   "schema": {"type": "array", "uniqueItems": True}}}
    refused = real.post(TEXT, json={"prompt": "Hi", "response_format": strict})
    assert refused.status_code == 400 and refused.json()["error"]["param"].startswith("response_format"), refused.text
