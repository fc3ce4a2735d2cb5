"""JSON output through the openai SDK's own helpers against a live `tandem serve` on the tiny random-init model:
`chat.completions.parse` and `responses.parse` with a pydantic model get an instance of it back (the reply follows
the schema token by token), streamed too; json_object mode gives an object; a schema that cannot be enforced or
JSON beside callable tools is a 400 naming the field."""

from __future__ import annotations

import json
from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field

from tests.e2e.conftest import TandemServer

MESSAGES = [{"role": "user", "content": "Describe the weather as JSON."}]


class Weather(BaseModel):
    sunny: bool
    celsius: int = Field(ge=-40, le=50)
    sky: Literal["clear", "cloudy", "rain"]


@pytest.fixture(scope="module")
def client(tiny_server: TandemServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_server.base_url, api_key="unused", max_retries=0, timeout=120)


def test_chat_parse_gives_the_model_back(client: openai.OpenAI) -> None:
    for temperature in (0.0, 1.0):
        reply = client.chat.completions.parse(model="", messages=MESSAGES, response_format=Weather,
                                              temperature=temperature, max_tokens=80)
        parsed = reply.choices[0].message.parsed
        assert isinstance(parsed, Weather) and reply.choices[0].finish_reason == "stop", reply
    with client.chat.completions.stream(model="", messages=MESSAGES, response_format=Weather, max_tokens=80,
                                        temperature=0) as stream:
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Weather)


def test_responses_parse_gives_the_model_back(client: openai.OpenAI) -> None:
    response = client.responses.parse(model="", input="Describe the weather as JSON.", text_format=Weather,
                                      max_output_tokens=80, temperature=0)
    assert isinstance(response.output_parsed, Weather)
    assert response.text is not None and response.text.format is not None
    assert response.text.format.type == "json_schema"


def test_json_object_mode_gives_an_object(client: openai.OpenAI) -> None:
    # Any JSON object: the random model's keys run on, so it is bounded by max_tokens; what came must open one.
    reply = client.chat.completions.create(model="", messages=MESSAGES, response_format={"type": "json_object"},
                                           temperature=0, max_tokens=40)
    content = reply.choices[0].message.content or ""
    assert content.startswith("{")
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)


def test_what_cannot_be_honoured_is_a_400_naming_the_field(client: openai.OpenAI) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "w", "strict": True,
                                                  "schema": {"type": "string", "format": "nope"}}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="", messages=MESSAGES, response_format=bad)  # type: ignore[arg-type]
    assert caught.value.body["param"] == "response_format" and "Unknown format" in caught.value.body["message"]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="", messages=MESSAGES, tools=tools,  # type: ignore[arg-type]
                                       response_format={"type": "json_object"})
    assert caught.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="", input="hi", tools=[{"type": "function", "name": "f", "parameters": {}}],
                                text={"format": {"type": "json_object"}})
    assert caught.value.body["param"] == "text.format"


def test_a_forced_call_comes_back_as_the_sdk_reads_it(client: openai.OpenAI) -> None:
    # The tiny model's template takes no tools: they are told in the prompt, its calls are <tool_call> text, which
    # the grammar writes from the first token (pydantic-ai's tool output, LangChain's function_calling).
    tool = openai.pydantic_function_tool(Weather, name="report")
    reply = client.chat.completions.create(model="", messages=MESSAGES, tools=[tool], tool_choice="required",
                                           temperature=0, max_tokens=120, parallel_tool_calls=False)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice
    call = choice.message.tool_calls[0]
    assert call.function.name == "report" and Weather.model_validate_json(call.function.arguments)
    named = client.chat.completions.parse(model="", messages=MESSAGES, tools=[tool], max_tokens=120, temperature=0,
                                          tool_choice={"type": "function", "function": {"name": "report"}},
                                          parallel_tool_calls=False)
    assert isinstance(named.choices[0].message.tool_calls[0].function.parsed_arguments, Weather)
