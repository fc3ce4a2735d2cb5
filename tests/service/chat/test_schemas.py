"""service/chat/schemas.py: every field a request carries is honoured or refused with a 400 naming it — an unknown
top-level field as OpenAI words it, a nested unknown field unless empty, a known field's values we cannot honour."""

from __future__ import annotations

from typing import Any

import pytest

from tests.service.fake_engine import FakeEngine

USER = [{"role": "user", "content": "hi"}]


TOOLS = [{"type": "function", "function": {"name": "get_weather-2", "parameters": {"type": "object"}}}]


def _chat(client: Any, **body: Any) -> Any:
    return client.post("/v1/chat/completions", json={"model": "fake-model", "messages": USER, **body})


def _refused(response: Any, param: str, *words: str) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert all(word in error["message"] for word in words), error
    return error


@pytest.mark.parametrize("field, value", [("web_search_options", {"search_context_size": "low"}),
                                          ("prediction", {"type": "content", "content": "x"}),
                                          ("audio", {"voice": "alloy"}), ("some_future_field", True)])
def test_an_unknown_field_is_refused_by_name_as_openai_refuses_it(client: Any, fake_engine: FakeEngine,
                                                                  field: str, value: Any) -> None:
    before = len(fake_engine.requests)
    if field == "some_future_field":
        error = _refused(_chat(client, **{field: value}), field, f"Unrecognized request argument supplied: {field}")
        assert error["code"] == "unknown_parameter"
    else:  # OpenAI's own fields this server cannot honour: named as such
        _refused(_chat(client, **{field: value}), field, "not supported by this server")
    assert len(fake_engine.requests) == before  # nothing reached the engine
    _refused(client.post("/v1/completions", json={"prompt": "x", field: value}), field, "Unrecognized")


@pytest.mark.parametrize("options", [{}, {"search_context_size": "low"}])
def test_web_search_options_are_refused_even_empty(client: Any, fake_engine: FakeEngine,
                                                   options: dict[str, Any]) -> None:
    # At OpenAI `{}` asks for a web search with default settings: it is not "nothing asked".
    before = len(fake_engine.requests)
    _refused(_chat(client, web_search_options=options), "web_search_options", "no web search is offered")
    assert len(fake_engine.requests) == before


@pytest.mark.parametrize("field, value", [("audio", {}), ("prediction", {}), ("functions", [])])
def test_an_empty_value_of_a_field_that_asks_nothing_when_empty_passes(client: Any, field: str, value: Any) -> None:
    # An audio object without settings, a prediction without content, no functions (legacy function calling,
    # tests/service/chat/test_legacy_functions.py): nothing there to honour.
    assert _chat(client, **{field: value}).status_code == 200


@pytest.mark.parametrize("field", ["stream", "n", "metadata", "audio", "prediction", "web_search_options", "functions",
                                   "function_call", "max_tokens", "tools", "tool_choice", "verbosity"])
def test_an_openai_field_sent_as_null_asks_for_nothing(client: Any, fake_engine: FakeEngine, field: str) -> None:
    # Clients that send every field of the SDK's request type, unset ones as null.
    response = _chat(client, **{field: None})
    assert response.status_code == 200, response.text
    assert response.json()["object"] == "chat.completion"  # null stream: not streamed


@pytest.mark.parametrize("field", ["stream", "n", "echo", "best_of"])
def test_a_completions_field_sent_as_null_asks_for_nothing(client: Any, field: str) -> None:
    response = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, field: None})
    assert response.status_code == 200, response.text
    assert response.json()["object"] == "text_completion"


def test_both_token_limits_at_once_stop_the_reply_at_the_smaller(client: Any, fake_engine: FakeEngine) -> None:
    # aiperf's `--extra-inputs max_tokens:16` sends both; each is an upper bound, neither dropped.
    for limits, limit in (((2, 8), 2), ((8, 3), 3), ((None, 3), 3), ((4, None), 4)):
        response = _chat(client, max_tokens=limits[0], max_completion_tokens=limits[1])
        assert response.status_code == 200, response.text
        assert fake_engine.requests[-1].max_tokens == limit
    _refused(_chat(client, max_tokens=8, max_completion_tokens=4, min_tokens=5), "min_tokens", "max_tokens (4)")


@pytest.mark.parametrize("key", ["٣", "3" * 5000, "+3", " 3", "-1"])
def test_a_logit_bias_key_must_be_an_ascii_token_id(client: Any, key: str) -> None:
    error = _refused(_chat(client, logit_bias={key: 1.0}), "logit_bias", "logit_bias keys must be token ids")
    assert "sys.set_int_max_str_digits" not in error["message"] and len(error["message"]) < 300


def test_an_earlier_refusal_part_is_read_as_text_and_media_parts_are_refused_in_words(client: Any,
                                                                                      fake_engine: FakeEngine) -> None:
    refused = {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]}
    assert _chat(client, messages=[*USER, refused, *USER]).status_code == 200
    image = {"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}
    _refused(_chat(client, messages=[image]), "messages.0.content", "'image_url' content parts are not supported",
             "text only")
    audio = {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}}]}
    _refused(_chat(client, messages=[audio]), "messages.0.content", "not audio")


CALL = {"role": "assistant", "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "shot", "arguments": "{}"}}]}


def test_what_a_tool_returned_that_the_model_cannot_read_is_told_in_a_line(client: Any,
                                                                          fake_engine: FakeEngine) -> None:
    # A screenshot tool's result (Cline, Roo, Zed): told as /v1/responses and /v1/messages tell it, not a 400.
    result = {"role": "tool", "tool_call_id": "c1", "content": [
        {"type": "text", "text": "screen:"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
        {"type": "file", "file": {"file_id": "f"}}]}
    response = _chat(client, messages=[*USER, CALL, result])
    assert response.status_code == 200, response.text
    prompt = fake_engine.tokenizer.decode(fake_engine.requests[-1].prompt_tokens)
    assert ("<tool>screen:[the tool returned an image: this model reads text only]"
            "[the tool returned a file: this model reads text only]<assistant>") in prompt


def test_a_tool_that_returned_nothing_as_an_empty_list_said_nothing(client: Any, fake_engine: FakeEngine) -> None:
    # Zed sends content [] for an empty result; vLLM reads it as "". Other roles' [] stays refused (below).
    response = _chat(client, messages=[*USER, CALL, {"role": "tool", "tool_call_id": "c1", "content": []}])
    assert response.status_code == 200, response.text
    assert fake_engine.requests[-1].prompt_tokens[-len("<tool><assistant>"):] == list(b"<tool><assistant>")


def test_completions_take_a_batch_of_one_token_list_and_best_of_one(client: Any, fake_engine: FakeEngine) -> None:
    response = client.post("/v1/completions", json={"prompt": [[5, 6, 7]], "max_tokens": 2, "best_of": 1})
    assert response.status_code == 200, response.text
    assert fake_engine.requests[-1].prompt_tokens == [5, 6, 7]
    _refused(client.post("/v1/completions", json={"prompt": [[5], []]}), "prompt", "must not be empty")
    _refused(client.post("/v1/completions", json={"prompt": ["a"] * 65}), "prompt", "at most 64 prompts")
    # Named `n`, counted as asked: the schema's check named `prompt` (and the capacity check `n`) for one request.
    _refused(client.post("/v1/completions", json={"prompt": ["a"] * 8, "n": 9}), "n",
             "n: 8 prompts × n = 9: 72 choices are more than one request may ask for (64)")
    _refused(client.post("/v1/completions", json={"prompt": "a", "n": 0}), "n", "n must be 1 to 64")
    _refused(client.post("/v1/completions", json={"prompt": "x", "best_of": 2}), "best_of", "only best_of=1")


def test_nested_unknown_fields_pass_while_empty_and_are_refused_otherwise(client: Any) -> None:
    # What the openai SDK's own message objects carry when a reply is sent back as history.
    echoed = {"role": "assistant", "content": "hello", "refusal": None, "annotations": [], "audio": None,
              "function_call": None}
    assert _chat(client, messages=[*USER, echoed, *USER]).status_code == 200
    _refused(_chat(client, messages=[{"role": "user", "content": "hi", "priority": {"level": 1}}]),
             "messages.0", "'priority' is not supported")
    # One level down, the error names the part, not another part type's field ("type: Input should be 'refusal'").
    error = _refused(_chat(client, messages=[{"role": "user", "content": [{"type": "text", "text": "hi", "x": 1}]}]),
                     "messages.0.content.0", "'x' is not supported")
    assert "more fields" not in error["message"]


def test_a_seed_outside_openais_range_is_refused(client: Any) -> None:
    # 2**64 drew as 0 did, 2**64 - 1 as -1 did: now a 400; OpenAI's signed 64-bit range passes.
    for seed in (2**64, 2**63, -(2**63) - 1):
        _refused(_chat(client, seed=seed), "seed")
    for seed in (-1, 2**63 - 1, -(2**63)):
        assert _chat(client, seed=seed).status_code == 200


def test_cache_control_breakpoints_are_accepted_and_checked(client: Any) -> None:
    # LiteLLM's and OpenRouter-style clients mark prompt-cache breakpoints Anthropic's way; the prefix cache keeps
    # prefixes whatever a request says, so the hint is honoured. They were a 400 naming the wrong field.
    part = {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
    messages = [{"role": "system", "content": [part]},
                {"role": "user", "content": "hi", "cache_control": {"type": "ephemeral", "ttl": "5m"}}]
    assert _chat(client, messages=messages).status_code == 200
    bad = {**part, "cache_control": {"type": "forever"}}
    _refused(_chat(client, messages=[{"role": "user", "content": [bad]}]), "messages.0.content.0.cache_control.type")
    _refused(_chat(client, stream=True, stream_options={"include_usage": True, "include_obfuscation": True}),
             "stream_options.include_obfuscation", "only false")
    assert _chat(client, stream=True, stream_options={"include_obfuscation": False}).status_code == 200


@pytest.mark.parametrize("body, param, words", [
    ({"response_format": {"type": "xml"}}, "response_format", ("'xml' is not one of",)),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "response_format",
     ("json_schema.name is required",)),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": []}}}, "response_format",
     ("must be a JSON Schema object",)),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict_mode": True}}},
     "response_format", ("has no field strict_mode",)),
    ({"tool_choice": "required", "tools": TOOLS}, "tool_choice", ("forced tool call is offered for models whose calls",
                                                                   "use \"auto\"")),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}, "tools": TOOLS}, "tool_choice",
     ("names function 'f', which tools does not declare",)),
    ({"store": True}, "store", ("keeps no completions",)),
    ({"service_tier": "flex"}, "service_tier", ()),
    ({"modalities": ["text", "audio"]}, "modalities.1", ()),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": True}}]}, "tools.0.function.strict",
     ("strict function calling is offered for models whose calls are <tool_call> JSON",)),
    ({"top_logprobs": 2}, "top_logprobs", ("needs logprobs",)),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", ()),
])
def test_a_value_that_cannot_be_honoured_is_refused_by_name(client: Any, body: dict[str, Any], param: str,
                                                            words: tuple[str, ...]) -> None:
    _refused(_chat(client, **body), param, *words)


def test_values_that_are_honoured_pass(client: Any, fake_engine: FakeEngine) -> None:
    response = _chat(client, response_format={"type": "text"}, store=False, service_tier="default",
                     modalities=["text"], tool_choice="auto", prompt_cache_retention="in_memory",
                     safety_identifier="end-user-7", tools=TOOLS)
    assert response.status_code == 200, response.text
    # OpenAI's first spelling, which older SDKs send
    assert _chat(client, prompt_cache_retention="in-memory").status_code == 200


NULL_REPLY = {"role": "assistant", "content": None}


@pytest.mark.parametrize("body, param, words", [
    ({"tool_choice": "auto"}, "tool_choice", ("only allowed when 'tools' are specified",)),
    ({"tool_choice": "none", "tools": None}, "tool_choice", ("only allowed when 'tools'",)),
    ({"parallel_tool_calls": False}, "parallel_tool_calls", ("only allowed when 'tools' are specified",)),
    ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools.0.function.name", ("pattern",)),
    ({"tools": [{"type": "function", "function": {"name": "f" * 65}}]}, "tools.0.function.name", ("pattern",)),
    ({"messages": [*USER, NULL_REPLY, *USER]}, "messages.1.content", ("needs content or tool_calls",)),
    ({"messages": [*USER, {**NULL_REPLY, "tool_calls": []}, *USER]}, "messages.1.content", ("tool_calls",)),
])
def test_what_openai_refuses_is_refused_by_name(client: Any, fake_engine: FakeEngine, body: dict[str, Any],
                                                param: str, words: tuple[str, ...]) -> None:
    # These were answered 200 where OpenAI answers 400.
    _refused(_chat(client, **body), param, *words)
    assert fake_engine.requests == []


@pytest.mark.parametrize("body", [
    {"tools": [], "tool_choice": "auto"},  # pi sends `tools: []` beside an agent's history; OpenAI would refuse it
    {"tools": TOOLS, "tool_choice": "none", "parallel_tool_calls": False},
    {"tools": [{"type": "function", "function": {"name": "a" * 64}}]},
    {"messages": [*USER, {**NULL_REPLY, "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "ok"}]},
])
def test_tool_fields_openai_takes_pass(client: Any, body: dict[str, Any]) -> None:
    assert _chat(client, **body).status_code == 200


def test_completions_refuse_a_suffix_and_too_many_logprobs(client: Any) -> None:
    _refused(client.post("/v1/completions", json={"prompt": "x", "suffix": "end"}), "suffix", "suffix")
    assert client.post("/v1/completions", json={"prompt": "x", "suffix": ""}).status_code == 200
    _refused(client.post("/v1/completions", json={"prompt": "x", "logprobs": 21}), "logprobs")  # vLLM's cap, 20


def test_litellms_cache_breakpoint_flag_is_accepted_and_checked(client: Any, fake_engine: FakeEngine) -> None:
    # CrewAI's litellm path marks messages `cache_breakpoint: true`: every crew step was a 400. The prefix cache keeps
    # prefixes whatever is marked, so the hint is honoured as cache_control is.
    part = {"type": "text", "text": "Be brief.", "cache_breakpoint": True}
    messages = [{"role": "system", "content": [part]}, {"role": "user", "content": "hi", "cache_breakpoint": True}]
    assert _chat(client, messages=messages).status_code == 200
    assert fake_engine.requests
    before = len(fake_engine.requests)
    _refused(_chat(client, messages=[{"role": "user", "content": "hi", "cache_breakpoint": "yes"}]),
             "messages.0.cache_breakpoint", "boolean")
    _refused(_chat(client, messages=[{"role": "user", "content": [{**part, "cache_breakpoint": {"on": 1}}]}]),
             "messages.0.content.0.cache_breakpoint", "boolean")
    assert len(fake_engine.requests) == before


def test_verbosity_other_than_medium_says_what_happens_instead(client: Any, fake_engine: FakeEngine) -> None:
    # It was refused as an unknown parameter, though it is OpenAI's chat field; as the Responses' text.verbosity.
    for value in ("low", "high"):
        error = _refused(_chat(client, verbosity=value), "verbosity", f"verbosity: {value!r} is not offered: replies "
                         "are as long as the model makes them (ask for brevity in a system message)")
        assert error["code"] == "invalid_value"
    assert not fake_engine.requests
    assert _chat(client, verbosity="medium").status_code == 200


def test_metadata_is_taken_and_goes_on_the_access_log_line(client: Any, caplog: pytest.LogCaptureFixture) -> None:
    # openai-agents' ModelSettings(metadata=...) was a 400 on chat; with no stored completions, the log line is where
    # the tags can go. /v1/responses, which echoes them, logs them as well.
    tags = {"run": "r-1", "note": 'a "quoted"\nline'}
    with caplog.at_level("INFO", logger="tandem.access"):
        assert _chat(client, metadata=tags).status_code == 200
        assert client.post("/v1/completions", json={"prompt": "x", "metadata": tags}).status_code == 200
        assert client.post("/v1/responses", json={"input": "x", "metadata": tags}).status_code == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "tandem.access"]
    logged = r' metadata {"run":"r-1","note":"a \"quoted\"\nline"} req_'  # one line, as JSON
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
        assert any(line.startswith(f"POST {path} 200") and logged in line for line in lines), (path, lines)


@pytest.mark.parametrize("metadata, param, words", [
    ({f"k{i}": "v" for i in range(17)}, "metadata", ("17 pairs", "at most 16 pairs")),
    ({"k" * 65: "v"}, "metadata", ("65 characters", "keys of at most 64")),
    ({"k": "v" * 513}, "metadata", ("513 characters", "values of at most 512")),
    ({"k": 1}, "metadata.k", ("valid string",)),
    (["k"], "metadata", ("valid dictionary",)),
])
def test_metadata_past_openais_limits_is_refused_by_name(client: Any, fake_engine: FakeEngine, metadata: Any,
                                                         param: str, words: tuple[str, ...]) -> None:
    _refused(_chat(client, metadata=metadata), param, *words)
    _refused(client.post("/v1/completions", json={"prompt": "x", "metadata": metadata}), param, *words)
    assert not fake_engine.requests
    assert _chat(client, metadata={f"k{i}": "v" * 512 for i in range(15)} | {"k" * 64: ""}).status_code == 200


def test_the_end_user_goes_on_the_access_log_line(client: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="tandem.access"):
        assert _chat(client, user='u-"1"').status_code == 200
        assert client.post("/v1/completions", json={"prompt": "x", "safety_identifier": "s-2"}).status_code == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "tandem.access"]
    assert any(line.startswith("POST /v1/chat/completions 200") and ' user "u-\\"1\\"" req_' in line for line in lines)
    assert any(line.startswith("POST /v1/completions 200") and ' user "s-2" req_' in line for line in lines)


@pytest.mark.parametrize("messages, param, words", [
    ([{"role": "user"}], "messages.0.content", ("a user message needs content",)),
    ([{"role": "system", "content": None}, *USER], "messages.0.content", ("needs content",)),
    ([{"role": "user", "content": []}], "messages.0.content", ("empty array",)),
    ([{"role": "user", "content": [{"text": "hi"}]}], "messages.0.content.0.type", ("required",)),
    ([*USER, {"role": "tool", "content": "42"}], "messages.1.tool_call_id", ("names the call",)),
])
def test_a_message_openai_refuses_is_refused_by_name(client: Any, fake_engine: FakeEngine,
                                                     messages: list[dict[str, Any]], param: str,
                                                     words: tuple[str, ...]) -> None:
    before = len(fake_engine.requests)
    _refused(_chat(client, messages=messages), param, *words)
    assert len(fake_engine.requests) == before


def test_stream_options_need_a_stream(client: Any) -> None:
    _refused(_chat(client, stream_options={"include_usage": True}), "stream_options", "only allowed when stream")


def test_a_streamed_reply_sent_back_as_the_sdk_assembles_it_is_taken(client: Any) -> None:
    # the openai SDK's stream helper leaves each call's `index` on the message it assembles
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    history = [*USER, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
    assert _chat(client, messages=history).status_code == 200


def test_top_p_zero_is_the_likeliest_token_only(client: Any, fake_engine: FakeEngine) -> None:
    assert _chat(client, top_p=0, temperature=1.5).status_code == 200
    sampling = fake_engine.requests[-1].sampling
    assert (sampling.temperature, sampling.top_p) == (0.0, 1.0)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_an_empty_body_is_unparsable_json(client: Any, path: str) -> None:
    response = client.post(path, content=b"", headers={"content-type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_json", None) and "empty" in error["message"]


def test_several_unknown_fields_are_all_named_as_openai_names_them(client: Any) -> None:
    error = _refused(_chat(client, foo=1, baz=2), "baz", "Unrecognized request arguments supplied: baz, foo")
    assert error["code"] == "unknown_parameter"


@pytest.mark.parametrize("path, field, value", [
    ("/v1/chat/completions", "max_tokens", "5"), ("/v1/chat/completions", "max_tokens", True),
    ("/v1/chat/completions", "stream", "yes"), ("/v1/chat/completions", "stream", 1),
    ("/v1/chat/completions", "temperature", "0.5"), ("/v1/chat/completions", "logprobs", 1),
    ("/v1/completions", "logprobs", True), ("/v1/completions", "echo", "true"),
])
def test_a_value_of_the_wrong_json_type_is_refused_not_coerced(client: Any, fake_engine: FakeEngine, path: str,
                                                                field: str, value: Any) -> None:
    # As OpenAI's API: "5" is not a number and true is not a count (lax parsing streamed for stream: "yes").
    before = len(fake_engine.requests)
    body = {"model": "fake-model", **({"messages": USER} if "chat" in path else {"prompt": "x"}), field: value}
    _refused(client.post(path, json=body), field)
    assert len(fake_engine.requests) == before
    assert client.post(path, json={**body, field: {"max_tokens": 5, "stream": False, "temperature": 0.5,
                                                   "logprobs": False if "chat" in path else 1,
                                                   "echo": True}[field]}).status_code == 200


def test_a_named_tool_choice_without_type_is_a_function() -> None:
    # huggingface_hub's typed tool_choice has no `type` (a 400 "tool_choice.type: Field required"); vLLM and TGI
    # default it. The forced call through a client is tests/service/chat/test_inference_client.py's.
    from service.chat.schemas import ChatCompletionRequest, NamedToolChoice

    body = ChatCompletionRequest.model_validate({"messages": USER, "tools": TOOLS,
                                                 "tool_choice": {"function": {"name": "get_weather-2"}}})
    assert isinstance(body.tool_choice, NamedToolChoice) and body.tool_choice.type == "function"
    assert body.tool_choice.function.name == "get_weather-2"


def test_a_fim_clients_long_stop_list_is_taken_and_a_longer_one_refused_by_name(client: Any,
                                                                                 fake_engine: FakeEngine) -> None:
    # Continue's autocomplete sends a template's special tokens, blank lines, a language's keywords and the user's
    # own: 14-20 strings (18 were a 400 when the limit was 16, and the editor showed no completions).
    stops = [f"<|fim_{i}|>" for i in range(9)] + ["\n\n", "\r\n\r\n", "/src/", "#- coding: utf-8", "```",
                                                   "function", "class", "module", "export "]
    assert client.post("/v1/completions", json={"prompt": "x", "stop": stops}).status_code == 200
    assert list(fake_engine.requests[-1].stop) == stops
    assert _chat(client, stop=stops).status_code == 200
    assert list(fake_engine.requests[-1].stop) == stops
    many = [f"s{i}" for i in range(65)]
    _refused(_chat(client, stop=many), "stop", "at most 64 stop strings")
    _refused(client.post("/v1/completions", json={"prompt": "x", "stop": many}), "stop", "at most 64")
