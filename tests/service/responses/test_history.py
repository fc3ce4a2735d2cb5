"""Responses input → the chat request: instructions and Codex's developer turns, calls and their results, earlier
thinking, custom and namespaced tools."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.http.errors import APIError
from service.responses.history import chat_request, input_items, seal_reasoning, unseal_reasoning
from service.responses.schemas import ResponsesRequest


def _chat(**body: Any) -> Any:
    chat, _ = chat_request(ResponsesRequest.model_validate(body))
    return chat


def _messages(**body: Any) -> list[dict[str, Any]]:
    return [m.model_dump(exclude_none=True) for m in _chat(**body).messages]


def test_a_string_input_is_one_user_message_after_the_instructions() -> None:
    assert _messages(input="hi", instructions="Be brief.") == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


def test_codex_system_and_developer_turns_become_one_system_turn_and_user_turns_in_a_row_one_user_turn() -> None:
    # Mistral's and Gemma's templates refused Codex's first turn (roles must alternate); R1's kept only the last
    # system turn (a mode change), dropping the instructions and the tools described in them.
    messages = _messages(instructions="You are Codex.", input=[
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<env>"}], "id": "msg_1"},
        {"role": "user", "content": "list files"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a.py"}]},
        {"type": "message", "role": "developer", "content": "<mode>plan off</mode>"},
        {"role": "user", "content": "go"}])
    assert messages == [
        {"role": "system", "content": "You are Codex.\n\n<permissions>\n\n<mode>plan off</mode>"},
        {"role": "user", "content": "<env>\n\nlist files"},
        {"role": "assistant", "content": "a.py"},
        {"role": "user", "content": "go"}]


def test_calls_join_the_assistant_turn_and_results_become_tool_messages() -> None:
    messages = _messages(input=[
        {"role": "user", "content": "list files"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking.",
                                                              "annotations": []}], "phase": "commentary"},
        {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": '{"cmd": "ls"}', "id": "fc_1",
         "status": "completed"},
        {"type": "function_call", "call_id": "call_2", "name": "shell", "arguments": '{"cmd": "pwd"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "a.py"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "/w"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}])
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert messages[1]["content"] == "Looking."
    assert [(c["id"], c["function"]["arguments"]) for c in messages[1]["tool_calls"]] == [
        ("call_1", '{"cmd": "ls"}'), ("call_2", '{"cmd": "pwd"}')]
    assert (messages[2]["tool_call_id"], messages[3]["content"]) == ("call_1", "/w")


@pytest.mark.parametrize("item, thinking", [
    ({"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "raw"}]}, "raw"),
    ({"type": "reasoning", "summary": [{"type": "summary_text", "text": "a"}, {"type": "summary_text", "text": "b"}]},
     "a\n\nb"),
    ({"type": "reasoning", "summary": [], "encrypted_content": seal_reasoning("sealed")}, "sealed"),
    ({"type": "reasoning", "summary": [], "encrypted_content": "gAAAAB-from-another-server"}, None),
])
def test_earlier_thinking_goes_back_beside_the_next_assistant_turn(item: dict[str, Any], thinking: str | None) -> None:
    messages = _messages(input=[{"role": "user", "content": "q"}, item,
                                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                                {"type": "function_call_output", "call_id": "c", "output": "ok"}])
    assert messages[1].get("reasoning_content") == thinking


def test_sealed_reasoning_round_trips_and_other_content_is_not_read() -> None:
    assert unseal_reasoning(seal_reasoning("a\nb")) == "a\nb"
    assert unseal_reasoning("opaque") is None and unseal_reasoning(None) is None


def test_custom_and_namespaced_tools_become_functions() -> None:
    body = ResponsesRequest.model_validate({"input": [
        {"role": "user", "content": "q"},
        {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "ok"},
        {"type": "function_call", "call_id": "c2", "name": "status", "namespace": "mcp__git__", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c2", "output": "clean"},
    ], "tools": [{"type": "custom", "name": "apply_patch", "format": {"type": "text"}},
                 {"type": "namespace", "name": "mcp__git__", "tools": [{"type": "function", "name": "status"}]},
                 {"type": "web_search", "external_web_access": False}]})
    chat, names = chat_request(body)
    assert [t.function.name for t in chat.tools or ()] == ["apply_patch", "mcp__git__status"]
    calls = [c.function for m in chat.messages for c in m.tool_calls or ()]
    assert json.loads(str(calls[0].arguments)) == {"input": "*** Begin Patch"} and calls[1].name == "mcp__git__status"
    assert names.item("apply_patch") == ("custom", "apply_patch", None)
    assert names.item("mcp__git__status") == ("function", "status", "mcp__git__")
    assert names.item("made_up") == ("function", "made_up", None)


def test_tool_choice_without_tools_is_taken_as_codex_sends_it() -> None:
    chat = _chat(input="hi", tool_choice="auto", parallel_tool_calls=False)
    assert chat.tools == [] and chat.tool_choice == "auto" and chat.parallel_tool_calls is False


def test_settings_map_onto_chat_fields() -> None:
    chat = _chat(input="hi", max_output_tokens=9, temperature=0.5, top_p=0.5, reasoning={"effort": "low"},
                 prompt_cache_key="k", user="u")
    assert (chat.max_tokens, chat.temperature, chat.top_p, chat.reasoning_effort, chat.prompt_cache_key, chat.user) \
        == (9, 0.5, 0.5, "low", "k", "u")


def test_a_namespace_name_too_long_together_is_refused_by_its_path() -> None:
    body = ResponsesRequest.model_validate({"input": "hi", "tools": [
        {"type": "namespace", "name": "n" * 40, "tools": [{"type": "function", "name": "f" * 30}]}]})
    with pytest.raises(APIError) as caught:
        chat_request(body)
    assert caught.value.status == 400 and caught.value.param == "tools[0].tools[0].name"


def test_an_image_a_tool_returned_is_told_in_a_line() -> None:
    # Refused, it stopped Codex's session for good: its history carries view_image's output every turn.
    messages = _messages(input=[
        {"role": "user", "content": "look"},
        {"type": "function_call", "call_id": "c", "name": "view_image", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": [
            {"type": "input_text", "text": "screenshot:"}, {"type": "input_image", "image_url": "data:,"}]}])
    assert messages[2]["content"] == "screenshot:[the tool returned an image: this model reads text only]"


def test_a_custom_tools_grammar_is_shown_in_its_description() -> None:
    # Codex's apply_patch declares a Lark grammar: refused, Codex could not run at all with it declared.
    body = ResponsesRequest.model_validate({"input": "hi", "tools": [
        {"type": "custom", "name": "apply_patch", "description": "Edit files.",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch hunk+ end_patch"}}]})
    (tool,) = chat_request(body)[0].tools or ()
    assert tool.function.description == ("Edit files.\n\nThe `input` string follows this lark grammar:\n"
                                         "start: begin_patch hunk+ end_patch")


def test_a_kept_conversation_that_cannot_be_read_back_is_a_400_not_a_500() -> None:
    body = ResponsesRequest.model_validate({"input": "more"})
    with pytest.raises(APIError) as caught:
        input_items(body, earlier=[{"type": "message", "role": "user", "content": 5}])
    assert caught.value.status == 400 and caught.value.param == "previous_response_id"


@pytest.mark.parametrize("items, words", [
    ([{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}, {"role": "user", "content": "ok?"}],
     "no output found for function call 'c1'"),
    ([{"type": "function_call_output", "call_id": "c9", "output": "x"}], "answers no earlier function_call"),
])
def test_calls_and_outputs_pair_or_are_refused_in_the_responses_words(items: list[Any], words: str) -> None:
    # Chat's sentence spoke of "tool messages", which /v1/responses has none of.
    with pytest.raises(APIError) as caught:
        _chat(input=[{"role": "user", "content": "q"}, *items])
    assert caught.value.status == 400 and caught.value.param == "input" and words in caught.value.message


def test_a_cut_call_echoed_back_without_output_never_ran_and_is_left_out() -> None:
    # LangChain (use_responses_api) sends back a call max_output_tokens cut (status "incomplete") with no output:
    # it never ran, so it is left out, not a 400; a complete call without output stays refused (above).
    cut = {"type": "function_call", "call_id": "c2", "name": "f", "arguments": '{"a": 1', "status": "incomplete"}
    ran = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "status": "completed"}
    messages = _messages(input=[{"role": "user", "content": "q"}, ran, cut,
                                {"type": "function_call_output", "call_id": "c1", "output": "1"},
                                {"role": "user", "content": "again"}])
    assert [(m["role"], [c["id"] for c in m.get("tool_calls", ())]) for m in messages] == [
        ("user", []), ("assistant", ["c1"]), ("tool", []), ("user", [])]
    custom = {"type": "custom_tool_call", "call_id": "c3", "name": "g", "input": "x", "status": "incomplete"}
    assert [m["role"] for m in _messages(input=[{"role": "user", "content": "q"}, custom])] == ["user"]
    # a cut call the client ran anyway, its output sent, stays in the prompt
    answered = _messages(input=[{"role": "user", "content": "q"}, cut,
                                {"type": "function_call_output", "call_id": "c2", "output": "2"}])
    assert [m["role"] for m in answered] == ["user", "assistant", "tool"]
