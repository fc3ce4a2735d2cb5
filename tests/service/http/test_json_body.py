"""service/http/json_body.py: a JSON body whose string holds an unpaired surrogate escape is a 400 saying so and
naming the field (msgspec's words were "Input data was truncated")."""

from __future__ import annotations

from typing import Any

import pytest

from service.http.json_body import lone_surrogate


@pytest.mark.parametrize("body, param, shown", [
    # a JS client cutting text mid-emoji: the high half alone, at the string's end, inside it, or the low half
    (b'{"messages":[{"role":"user","content":"\\ud800"}]}', "messages.0.content", "\\ud800"),
    (b'{"messages":[{"role":"user","content":"hi \\ud83d!"}]}', "messages.0.content", "\\ud83d"),
    (b'{"messages":[{"role":"user","content":"a\\uDC00b"}]}', "messages.0.content", "\\udc00"),
    (b'{"messages":[{"role":"user","content":"\\ud800\\u0041"}]}', "messages.0.content", "\\ud800"),
])
def test_an_unpaired_surrogate_is_a_400_naming_the_field(client: Any, body: bytes, param: str, shown: str) -> None:
    response = client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "invalid_json" and error["param"] == param
    assert f"the string at {param} holds an unpaired surrogate ({shown}), which is not valid Unicode" in \
        error["message"], error["message"]


def test_where_the_surrogate_is() -> None:
    assert lone_surrogate(b'{"a":["ok","\\ud83d\\ude00",{"b":"x\\udfff"}]}') == ("a.2.b", "\udfff")
    assert lone_surrogate(b'{"a":{"k\\ud800":1}}') == ("a", "\ud800")  # a key's: its object's path
    assert lone_surrogate(b'"\\udbff"') == (None, "\udbff")
    # a pair is a character; an escaped backslash before "u" no escape; a malformed text no answer
    assert lone_surrogate(b'{"a":"\\ud83d\\ude00","b":"\\\\ud800"}') is None
    assert lone_surrogate(b'{"a":"\\ud800"') is None


def test_other_malformed_json_keeps_the_decoders_words(client: Any) -> None:
    response = client.post("/v1/chat/completions", content=b'{"messages": [',
                           headers={"content-type": "application/json"})
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "invalid_json" and "surrogate" not in error["message"]
