"""A scripted stand-in for engine.runtime.Engine: satisfies service.seams.ChatEngine, no MLX; replies are
fixed text pieces."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio

from engine.contracts import Delta, GenerationRequest, TokenLogprob
from engine.errors import ContextTooLong
from engine.tasks import ExecutionTasks
from service.chat.prompt import PROBE_TEXT

__all__ = ["FakeTokenizer", "FakeEngine", "FakeStream", "rendered_prompt"]


class FakeTokenizer:
    """One token per character (ord), a ChatML-ish template; enough for prompt lengths and usage."""

    has_chat_template = True
    eos_token_ids = {0}

    def __init__(self, vocab: int = 0x3000) -> None:
        self.vocab = vocab
        self.template_calls: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return self.vocab

    def encode(self, text: str, **_: Any) -> list[int]:
        return [min(ord(c), self.vocab - 1) for c in text]

    def decode(self, tokens: list[int]) -> str:
        return "".join(chr(t) for t in tokens)

    def get_vocab(self) -> dict[str, int]:
        return {chr(i): i for i in range(self.vocab)}

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: Any = None, *, tokenize: bool = True,
                            **kwargs: Any) -> list[int] | str:
        if not any(m.get("content") == PROBE_TEXT for m in messages):  # the server's probe is no request's prompt
            self.template_calls.append({"messages": messages, "tools": tools, **kwargs})
        if kwargs.get("fail"):
            raise ValueError("template says no")
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        text += "" if kwargs.get("continue_final_message") else "<assistant>"  # a prefill ends the prompt
        return self.encode(text) if tokenize else text


@dataclass
class FakeStream:
    """A row's delta stream: the scripted pieces, one delta each, then finish; `aclose` frees the row."""

    engine: "FakeEngine"
    request: GenerationRequest
    pieces: list[str]
    closed: bool = False
    gate: anyio.Event | None = None  # the second token waits for it
    first_gate: anyio.Event | None = None  # the first token waits for it
    _sent: int = field(default=0)
    _ended: bool = False
    _stop: anyio.Event = field(default_factory=anyio.Event)  # set by cancel: a stalled read ends, as a real one does

    def __aiter__(self) -> "FakeStream":
        return self

    async def __anext__(self) -> Delta:
        # Cancel-safe, as a real row's read (a memory stream's receive): every wait comes before any state changes.
        i = self._sent
        if self.closed or i >= len(self.pieces) or self._ended:
            raise StopAsyncIteration
        gate = self.first_gate if i == 0 else self.gate if i == 1 else None
        if gate is not None:
            await _first_of(gate, self._stop)  # stalls before the first or second token until released or cancelled
            if self.closed:
                raise StopAsyncIteration
        await anyio.sleep(0)
        piece, budget = self.pieces[i], self.request.max_tokens
        self._sent += 1
        last = self._sent >= budget or i == len(self.pieces) - 1
        finish = ("length" if self._sent >= budget and i < len(self.pieces) - 1 else "stop") if last else None
        if last:
            self._ended = True
            self.engine.active.discard(id(self))
        return Delta(
            text=piece,
            token_ids=[i + 1],
            logprobs=_logprobs(piece, i, self.request.sampling.logprobs),
            prompt_logprobs=_prompt_logprobs(self.request) if i == 0 else None,
            finish_reason=finish,  # type: ignore[arg-type]
            prompt_tokens=len(self.request.prompt_tokens),
            completion_tokens=self._sent,
            cached_tokens=self.engine.cached_tokens,
            cache_write_tokens=self.engine.cache_write_tokens if last else 0,  # known once the row has left
            error=self.engine.fail_with if i == self.engine.fail_at else None,
        )

    def receive_nowait(self) -> Delta:
        raise anyio.WouldBlock  # scripted deltas are produced as they are read, never waiting

    async def aclose(self) -> None:
        self.cancel()

    def cancel(self) -> None:
        if not self.closed:
            self.engine.closed_streams += 1
        self.closed = True
        self._stop.set()
        self.engine.active.discard(id(self))


def _logprobs(piece: str, i: int, k: int | None) -> list[TokenLogprob]:
    """Scripted log probabilities of a piece's token (its first character's id), the i-th: -(i + 1) / 10, and k
    alternatives after it, each 1 lower."""
    if k is None or not piece:
        return []
    value = -(i + 1) / 10
    return [TokenLogprob(ord(piece[0]), value, tuple((ord(piece[0]) + j, value - j) for j in range(k)))]


def _prompt_logprobs(request: GenerationRequest) -> list[TokenLogprob] | None:
    """Scripted prompt log probabilities when asked: the j-th token after the first -(j + 1) / 100, its k
    alternatives the ids after it, each 1 lower."""
    k = request.prompt_logprobs
    if k is None:
        return None
    return [TokenLogprob(t, -(j + 1) / 100, tuple((t + n + 1, -(j + 1) / 100 - n - 1) for n in range(k)))
            for j, t in enumerate(request.prompt_tokens[1:])]


async def _first_of(*events: anyio.Event) -> None:
    async with anyio.create_task_group() as tg:
        async def until(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        for event in events:
            tg.start_soon(until, event)


class FakeEngine:
    """The ChatEngine surface: submit, serve, close, stats, tokenizer, model_name, plan, tasks."""

    def __init__(self, pieces: list[str] | None = None, *, context_length: int = 256, run_tasks: bool = False) -> None:
        self.model_name: str | None = "fake-model"
        self.model_root: str | None = "/models/fake-model"
        self.context_length: int | None = context_length
        self.budget_fits: int | None = None  # tokens the memory budget holds for one request (None: the context)
        self.plan = None
        # run_tasks: a real tasks-only engine runs `tasks` (speech work) beside the scripted chat rows; a new
        # one for each serve(), so the app can start again after a shutdown.
        self.run_tasks = run_tasks
        self._tasks_engine: Any = None
        self.tasks = ExecutionTasks()
        self.tokenizer: Any = FakeTokenizer()
        self.vocab_size: int | None = len(self.tokenizer)
        self.sampling_defaults: dict[str, float] = {}  # a model's generation_config.json recommendation
        self.pieces = pieces if pieces is not None else ["Hel", "lo", " wor", "ld", "!"]
        self.failing: str | None = None  # set: health() reports the engine cannot run rows
        self.requests: list[GenerationRequest] = []
        self.prepared: list[Any] = []  # grammars built before their requests (prepare_grammar)
        self.active: set[int] = set()
        self.closed_streams = 0
        self.cached_tokens = 0
        self.cache_write_tokens = 0  # the prompt tokens past cached_tokens the row stored in the prefix cache
        self.fail_with: str | None = None
        self.fail_at = 1  # the delta (0-based) that carries fail_with
        self.gate: anyio.Event | None = None
        self.first_gate: anyio.Event | None = None
        self.serving = False
        self._closed: anyio.Event | None = None

    async def serve(self) -> None:
        if self.run_tasks:  # before the first await: hooks started after serve() read `tasks`
            from engine.runtime import Engine

            self._tasks_engine = Engine(None)
            self.tasks = self._tasks_engine.tasks
        self._closed = anyio.Event()
        self.serving = True
        async with anyio.create_task_group() as tg:
            if self._tasks_engine is not None:
                tg.start_soon(self._tasks_engine.serve)
            await self._closed.wait()
            if self._tasks_engine is not None:
                self._tasks_engine.close()
        self.serving = False

    @property
    def max_model_len(self) -> int | None:
        """The context, or less where `budget_fits` says the memory budget holds less."""
        if self.context_length is None or self.budget_fits is None:
            return self.context_length
        return min(self.context_length, self.budget_fits)

    def refuse_queued(self) -> int:
        self.refused_queued = True  # the scripted rows never queue: nothing waits
        return 0

    def close(self) -> None:
        if self._closed is not None:
            self._closed.set()
        elif self._tasks_engine is not None:
            self._tasks_engine.close()

    def prepare_grammar(self, spec: Any) -> None:
        self.prepared.append(spec)

    def submit(self, request: GenerationRequest) -> FakeStream:
        if self.context_length is not None and len(request.prompt_tokens) >= self.context_length:
            raise ContextTooLong(f"prompt of {len(request.prompt_tokens)} tokens does not fit the context")
        self.requests.append(request)
        stream = FakeStream(self, request, list(self.pieces), gate=self.gate, first_gate=self.first_gate)
        self.active.add(id(stream))
        return stream

    def chat_pace(self) -> float | None:
        return None

    def health(self) -> dict[str, Any]:
        return {"ok": self.failing is None} if self.failing is None else {"ok": False, "error": self.failing}

    def stats(self) -> dict[str, Any]:
        return {"active_rows": len(self.active), "queued_rows": 0, "plan": {"reasons": ["fake"]}}



def rendered_prompt(tokenizer: Any, body: dict[str, Any]) -> str:
    """The prompt the server renders for a chat request `body` with a real `tokenizer` (decoded), the engine
    scripted. Fails the test when the request is not a 200."""
    from litestar.testing import TestClient

    from service.app import create_app
    from service.state import AppState

    engine = FakeEngine(["ok"], context_length=4096)
    engine.tokenizer = tokenizer
    with TestClient(create_app(AppState(engine=engine))) as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return str(tokenizer.decode(engine.requests[-1].prompt_tokens))
