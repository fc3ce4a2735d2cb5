"""The context a memory budget gives a hybrid model over HTTP: a prompt its caches hold is served, a longer one gets a
400 naming the limit (engine/kv_shape.py: Qwen3.5's recurrent layers are no longer charged as attention a token)."""

from __future__ import annotations

import pytest
from litestar.testing import TestClient

from engine.runtime import Engine
from service.app import create_app
from service.state import AppState
from tests.engine.test_batch import prompt_of
from tests.engine.test_kv_shape import CHUNK, LONG, _held, _loaded, _tight_total


async def _total(tmp_path_factory: pytest.TempPathFactory) -> int:
    loaded = _loaded("qwen3_5", tmp_path_factory)
    return _tight_total(loaded, await _held(loaded, prompt_of(LONG, 4), 8))


def test_a_hybrid_prompt_its_caches_hold_is_served_and_a_longer_one_is_a_400(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    # A budget 1.5 times what the 900-token prompt's caches hold: every layer charged per token refused it with the
    # 400 below ("maximum context length is 1 tokens").
    import anyio

    loaded = _loaded("qwen3_5", tmp_path_factory)
    total = anyio.run(_total, tmp_path_factory)
    engine = Engine(loaded, memory_budget=total, max_iteration_tokens=CHUNK)
    with TestClient(create_app(AppState(engine=engine))) as client:
        body = {"model": engine.model_name, "max_tokens": 8, "temperature": 0}
        served = client.post("/v1/completions", json={**body, "prompt": prompt_of(LONG, 4)})
        assert served.status_code == 200, served.text
        assert served.json()["usage"]["completion_tokens"] == 8 and served.json()["choices"][0]["text"]
        refused = client.post("/v1/completions", json={**body, "prompt": prompt_of(2 * LONG, 5)})
    assert LONG < engine.max_model_len < 2 * LONG  # type: ignore[operator]
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("context_over_budget", "prompt"), error
    assert f"maximum context length is {engine.max_model_len} tokens under this server's memory budget" \
        in error["message"], error
