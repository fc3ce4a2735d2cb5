"""The openai SDK's Responses client against a live `tandem serve` on the tiny model: the same greedy reply as
chat completions, streamed through the SDK's helper and not, and usage as chat counts it."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.conftest import TandemServer

SYSTEM, USER = "You answer briefly.", "Hello world! What is the answer?"


@pytest.fixture(scope="module")
def client(tiny_server: TandemServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_server.base_url, api_key="unused", max_retries=0, timeout=120)


def test_a_response_is_the_chat_reply_streamed_or_not(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    chat = client.chat.completions.create(model=model, temperature=0, max_tokens=12, messages=[
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}])
    response = client.responses.create(model=model, instructions=SYSTEM, input=USER, temperature=0,
                                       max_output_tokens=12)
    assert response.output_text == chat.choices[0].message.content
    assert response.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert chat.usage is not None and response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (chat.usage.prompt_tokens,
                                                                           chat.usage.completion_tokens)
    with client.responses.stream(model=model, instructions=SYSTEM, input=USER, temperature=0,
                                 max_output_tokens=12) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response() if response.status == "completed" else None
    assert "".join(deltas) == response.output_text
    if final is not None:
        assert final.output_text == response.output_text
