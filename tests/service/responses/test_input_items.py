"""GET /v1/responses/{id}/input_items through the openai SDK's own client and pager: a kept response's input
items with stable ids, paged after an id in either order, the conversation it continued included; refusals by
name."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from litestar.testing import TestClient

from tests.service.fake_engine import FakeEngine

CALL_ITEM = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"}
TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(["Sunny."])


def _conversation(sdk: openai.OpenAI) -> Any:
    return sdk.responses.create(model="fake-model", tools=TOOLS, input=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "weather?"}], "id": "msg_mine"},
        CALL_ITEM, {"type": "function_call_output", "call_id": "call_1", "output": "18C"}])


def test_the_sdk_lists_a_responses_input_items_newest_first_with_ids(sdk: openai.OpenAI) -> None:
    created = _conversation(sdk)
    page = sdk.responses.input_items.list(created.id)
    kinds = [(item.type, getattr(item, "role", None)) for item in page.data]
    assert kinds == [("function_call_output", None), ("function_call", None), ("message", "user"),
                     ("message", "system")]
    output, call, user, system = page.data
    assert user.id == "msg_mine"  # the id it was sent with
    assert system.id.startswith("msg_") and call.id.startswith("fc_") and output.id.startswith("fco_")
    assert system.content[0].type == "input_text" and system.content[0].text == "Be brief."
    assert user.status == call.status == output.status == "completed" and output.output == "18C"
    assert (page.first_id, page.last_id, page.has_more) == (output.id, system.id, False)
    # Ids are kept with the response: listed again, they are the same.
    assert [i.id for i in sdk.responses.input_items.list(created.id, order="asc").data] == [
        system.id, user.id, call.id, output.id]


def test_pages_follow_after_the_last_id_in_either_order(sdk: openai.OpenAI) -> None:
    created = _conversation(sdk)
    whole = [i.id for i in sdk.responses.input_items.list(created.id, order="asc").data]
    first = sdk.responses.input_items.list(created.id, order="asc", limit=3)
    assert [i.id for i in first.data] == whole[:3] and first.has_more is True
    assert [i.id for i in sdk.responses.input_items.list(created.id, order="asc", limit=3, after=whole[2]).data] == [
        whole[3]]
    # The SDK's pager asks for the next page after the last id until has_more is false.
    assert [i.id for i in sdk.responses.input_items.list(created.id, limit=1)] == whole[::-1]
    assert [i.id for i in sdk.responses.input_items.list(created.id, order="asc", limit=2)] == whole


def test_a_continued_response_lists_the_conversation_it_was_made_from(sdk: openai.OpenAI,
                                                                      engine: FakeEngine) -> None:
    first = sdk.responses.create(model="fake-model", input="Capital of France?")
    engine.pieces = ["Lyon."]
    second = sdk.responses.create(model="fake-model", input="And its second city?", previous_response_id=first.id)
    items = sdk.responses.input_items.list(second.id, order="asc").data
    assert [(i.role, i.content[0].text) for i in items] == [
        ("user", "Capital of France?"), ("assistant", "Sunny."), ("user", "And its second city?")]
    assert items[1].id == first.output[0].id and items[1].content[0].type == "output_text"
    assert len({i.id for i in items}) == 3


def test_an_item_referred_to_twice_is_listed_under_two_ids(http: TestClient[Any]) -> None:
    message = http.post("/v1/responses", json={"input": "hi"}).json()["output"][0]
    ref = {"type": "item_reference", "id": message["id"]}
    created = http.post("/v1/responses", json={"input": [ref, ref]}).json()
    listed = http.get(f"/v1/responses/{created['id']}/input_items", params={"order": "asc"}).json()["data"]
    assert listed[0]["id"] == message["id"] and listed[1]["id"] != message["id"]  # `after` must name one item
    assert listed[0]["content"] == [{"type": "output_text", "text": "Sunny.", "annotations": []}]


def test_a_response_not_kept_is_a_404(sdk: openai.OpenAI, http: TestClient[Any]) -> None:
    with pytest.raises(openai.NotFoundError):
        sdk.responses.input_items.list("resp_elsewhere")
    unkept = http.post("/v1/responses", json={"input": "hi", "store": False}).json()
    response = http.get(f"/v1/responses/{unkept['id']}/input_items")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(("query", "param"), [
    ({"limit": "0"}, "limit"), ({"limit": "101"}, "limit"), ({"order": "up"}, "order"),
    ({"after": "msg_none"}, "after"), ({"include[]": "message.input_image.image_url"}, "include"),
    ({"include": "file_search_call.results"}, "include"), ({"before": "msg_1"}, "before"),
])
def test_query_parameters_not_honoured_are_refused_by_name(http: TestClient[Any], query: dict[str, str],
                                                            param: str) -> None:
    created = http.post("/v1/responses", json={"input": "hi"}).json()
    response = http.get(f"/v1/responses/{created['id']}/input_items", params=query)
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


def test_reasoning_items_carry_their_encrypted_content_only_when_included(sdk: openai.OpenAI) -> None:
    created = sdk.responses.create(model="fake-model", input=[
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}], "encrypted_content": "opaque"},
        {"role": "user", "content": "go on"}])
    plain = sdk.responses.input_items.list(created.id, order="asc").data[0]
    assert plain.type == "reasoning" and plain.encrypted_content is None and plain.summary[0].text == "hmm"
    sealed = sdk.responses.input_items.list(created.id, order="asc", include=["reasoning.encrypted_content"]).data[0]
    assert sealed.encrypted_content == "opaque"


def test_listed_input_items_can_be_referred_to_by_their_ids(http: TestClient[Any], engine: FakeEngine) -> None:
    # As at OpenAI, an item_reference names any item of a kept response: its input's too, by the id listed.
    created = http.post("/v1/responses", json={"tools": TOOLS, "input": [
        {"role": "user", "content": "a"}, {"type": "message", "id": "msg_mine", "role": "user", "content": "b"},
        CALL_ITEM, {"type": "function_call_output", "call_id": "call_1", "output": "18C"}]}).json()
    listed = http.get(f"/v1/responses/{created['id']}/input_items", params={"order": "asc"}).json()["data"]
    assert listed[1]["id"] == "msg_mine"
    refs = [{"type": "item_reference", "id": item["id"]} for item in listed]
    response = http.post("/v1/responses", json={"tools": TOOLS, "input": [*refs, {"role": "user", "content": "c"}]})
    assert response.status_code == 200, response.text
    messages = engine.tokenizer.template_calls[-1]["messages"]
    assert messages[0] == {"role": "user", "content": "a\n\nb"} and messages[-1]["content"] == "c"
    assert messages[1]["tool_calls"][0]["id"] == "call_1" and messages[2]["content"] == "18C"
    # The second response holds them too (under the same ids); once both are deleted they name nothing.
    for response_id in (response.json()["id"], created["id"]):
        assert http.delete(f"/v1/responses/{response_id}").status_code == 200
    gone = http.post("/v1/responses", json={"input": [{"type": "item_reference", "id": "msg_mine"}]})
    assert gone.status_code == 400 and gone.json()["error"]["code"] == "item_not_found"


def test_an_input_id_several_responses_share_names_the_newest(http: TestClient[Any], engine: FakeEngine) -> None:
    for said in ("first", "second"):
        http.post("/v1/responses", json={"input": [{"type": "message", "id": "msg_mine", "role": "user",
                                                      "content": said}]})
    response = http.post("/v1/responses", json={"input": [{"type": "item_reference", "id": "msg_mine"}]})
    assert response.status_code == 200, response.text
    assert engine.tokenizer.template_calls[-1]["messages"] == [{"role": "user", "content": "second"}]
