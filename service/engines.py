"""How the app factory builds its engine: around the configured chat model, or tasks-only (a
transcription-only server). The factory (service/app.py) runs these at startup and owns the result."""

from __future__ import annotations

from service.config import ServiceConfig
from service.seams import ChatEngine

__all__ = ["open_engine", "open_tasks_engine"]


async def open_engine(config: ServiceConfig) -> ChatEngine:
    """Load the configured chat model and build the engine around it.

    Raises engine.errors.ModelNotFound when no model can be found, and whatever loading raises."""
    from engine.runtime import Engine

    # The model loads on the engine's own thread (MLX streams are per thread), off the event loop.
    return await Engine.open(config.model, max_active=config.max_active, max_queued=config.queue_limit,
                             max_iteration_tokens=config.max_iteration_tokens, prefill_stall=config.prefill_stall,
                             decode_burst=config.decode_burst,
                             prompt_cache_bytes=config.prompt_cache_bytes, memory_budget=config.memory_budget)


async def open_tasks_engine(config: ServiceConfig) -> ChatEngine:
    """An engine with no chat model: its loop runs speech tasks only. Raises nothing."""
    from engine.runtime import Engine

    return Engine(None)
