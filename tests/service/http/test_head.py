"""service/http/head.py: HEAD on a GET route answers as the GET, headers only."""

from __future__ import annotations

from typing import Any


def test_head_answers_as_get_without_a_body(client: Any) -> None:
    for path in ("/health", "/v1/models", "/stats"):
        got, head = client.get(path), client.head(path)
        assert head.status_code == got.status_code == 200, (path, head.status_code)
        assert head.content == b"" and head.headers["content-type"] == got.headers["content-type"]
    assert client.head("/v1/chat/completions").status_code == 405  # a POST route stays one
