"""ResponseOutput's response.in_progress snapshots: the keep-alive sent while a stream is quiet carries the items
so far, as a client following the events holds them."""

from __future__ import annotations

from typing import Any

from service.chat.replies import ChoiceDelta, FunctionCallDelta, ToolCallDelta
from service.responses.history import ToolNames
from service.responses.output import ResponseOutput
from service.responses.schemas import ResponsesRequest
from tests.service.sse_events import named_events


def _snapshot(output: ResponseOutput) -> list[dict[str, Any]]:
    """The output of the keep-alive `opening()` sends now."""
    (event,) = named_events(output.opening().decode())
    assert event["type"] == "response.in_progress" and event["response"]["status"] == "in_progress"
    return event["response"]["output"]


def test_a_quiet_streams_in_progress_carries_the_items_so_far() -> None:
    # It said output [] after output_item.added: a client replacing its snapshot lost what it had been sent.
    output = ResponseOutput(ResponsesRequest.model_validate({"input": "hi"}), "m", ToolNames())
    output.opening()  # created, then in_progress: nothing yet
    output.feed(ChoiceDelta(reasoning_content="hm"))
    output.feed(ChoiceDelta(content="Sun"))
    reasoning, message = _snapshot(output)
    assert reasoning["summary"] == [{"type": "summary_text", "text": "hm"}] and reasoning["type"] == "reasoning"
    assert message["status"] == "in_progress" and message["content"][0]["text"] == "Sun"
    output.feed(ChoiceDelta(content="ny"))
    assert _snapshot(output)[1]["content"][0]["text"] == "Sunny"
    call = ToolCallDelta(index=0, id="call_1", function=FunctionCallDelta(name="f", arguments='{"a"'))
    output.feed(ChoiceDelta(tool_calls=[call]))
    snapshot = _snapshot(output)
    assert snapshot[1]["status"] == "completed" and snapshot[1]["content"][0]["text"] == "Sunny"
    assert snapshot[2]["type"] == "function_call" and snapshot[2]["arguments"] == '{"a"'
    output.feed(ChoiceDelta(tool_calls=[ToolCallDelta(index=0, function=FunctionCallDelta(arguments=": 1}"))]))
    output.close()
    assert output.items[2]["arguments"] == '{"a": 1}' and output.items[2]["status"] == "completed"
    assert _snapshot(output) == output.items  # nothing open: the items as they are


def test_the_arguments_done_event_names_the_function_as_openais_does() -> None:
    # openai-java 4.52's ResponseFunctionCallArgumentsDoneEvent requires `name` (openai-python's declares it too)
    from openai.types.responses import ResponseFunctionCallArgumentsDoneEvent

    output = ResponseOutput(ResponsesRequest.model_validate({"input": "hi"}), "m", ToolNames())
    output.opening()
    call = ToolCallDelta(index=0, id="call_1", function=FunctionCallDelta(name="get_weather", arguments='{"a": 1}'))
    events = named_events(b"".join([*output.feed(ChoiceDelta(tool_calls=[call])), *output.close()]).decode())
    (done,) = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    parsed = ResponseFunctionCallArgumentsDoneEvent.model_validate(done)
    assert (parsed.name, parsed.arguments, parsed.item_id) == ("get_weather", '{"a": 1}', output.items[0]["id"])
