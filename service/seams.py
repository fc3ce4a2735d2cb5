"""What service/ needs of the layers below it, as Protocols: the seams a test double can stand in at.

`engine.runtime.Engine` and tests/service/fake_engine.py both satisfy ChatEngine; `audio.speech.SpeechService`
satisfies SpeechBackend. Nothing here imports mlx: the engine and audio types are named for the checker only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, AsyncGenerator, AsyncIterator, Protocol, Sequence, runtime_checkable

from engine.contracts import Delta, GenerationRequest, GrammarSpec

if TYPE_CHECKING:
    import numpy as np

    from audio.sessions import LiveSession
    from audio.transcript import Segment, TokenCounts, TranscribeOptions, Transcript
    from engine.tasks import ExecutionTasks

__all__ = ["ChatTokenizer", "RowStream", "EnginePlan", "ChatEngine", "WhisperModelFiles", "SpeechBackend"]


class ChatTokenizer(Protocol):
    """The tokenizer calls the routes make (mlx-lm's TokenizerWrapper, or a test double)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, tokens: list[int]) -> str: ...

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any: ...

    def __len__(self) -> int: ...

    @property
    def has_chat_template(self) -> bool: ...


class RowStream(Protocol):
    """One generation's deltas; `aclose()` cancels the row and frees its KV. A read (`__anext__`) cancelled
    while it waits gives nothing up: the next read gets the delta (service/chat/stream.py waits with a timeout)."""

    def __aiter__(self) -> AsyncIterator[Delta]: ...

    def receive_nowait(self) -> Delta:
        """The next delta if one is waiting. Raises anyio.WouldBlock when none is, anyio.EndOfStream at the end."""
        ...

    async def aclose(self) -> None: ...

    def cancel(self) -> None:
        """Cancel the row now, from a plain callback (a deadline's timer); a read waiting then ends. Raises
        nothing."""
        ...


class EnginePlan(Protocol):
    """How the engine runs the model, in words for the startup banner."""

    @property
    def reasons(self) -> Sequence[str]: ...


@runtime_checkable
class ChatEngine(Protocol):
    """The engine as the app sees it: a loop to run and close, rows to submit, a task queue for speech.

    With no chat model loaded (a transcription-only server) `tokenizer` and `model_name` are None."""

    @property
    def tokenizer(self) -> ChatTokenizer | None: ...

    @property
    def model_name(self) -> str | None: ...

    @property
    def model_root(self) -> str | None:
        """Where the model comes from, as vLLM's /v1/models `root`: its repo id, else the directory its weights and
        tokenizer were read from; None without a model."""

    @property
    def context_length(self) -> int | None: ...

    @property
    def max_model_len(self) -> int | None:
        """The most tokens (prompt + max_tokens) one request can have: the model's context, or less where the memory
        budget holds less KV; None without a model."""

    @property
    def vocab_size(self) -> int | None:
        """Token ids the model accepts (its embedding may be larger than the tokenizer); None without a model."""
        ...

    @property
    def sampling_defaults(self) -> dict[str, float]:
        """Sampling settings the model recommends (generation_config.json) for fields a request leaves out."""
        ...

    @property
    def plan(self) -> EnginePlan | None: ...

    @property
    def tasks(self) -> ExecutionTasks: ...

    def prepare_grammar(self, spec: GrammarSpec) -> None:
        """Build a constrained reply's matchers before its request is submitted. Blocking: call it in a worker
        thread. Raises engine.constraints.ConstraintError for a grammar that cannot be followed."""
        ...

    def submit(self, request: GenerationRequest) -> RowStream:
        """Queue a generation. Raises engine.errors.EngineError subclasses (typed, mapped to HTTP)."""
        ...

    async def serve(self) -> None: ...

    def refuse_queued(self) -> int:
        """Shutting down: requests not yet running end now as cancelled, new ones are refused, running ones go
        on. Returns how many were waiting (as far as this side knows). Raises nothing."""
        ...

    def close(self) -> None: ...

    def health(self) -> dict[str, Any]:
        """{"ok": True}, or {"ok": False, "error": ...} while the engine cannot run rows."""
        ...

    def stats(self) -> dict[str, Any]: ...

    def chat_pace(self) -> float | None:
        """Seconds a decode-only chat iteration takes while chat rows decode, else None (Whisper steps pace
        themselves by it)."""
        ...


class WhisperModelFiles(Protocol):
    """Where the served Whisper checkpoint lives and in what precision (for logs and aliases)."""

    @property
    def path(self) -> Any: ...

    @property
    def dtype(self) -> str: ...


class SpeechBackend(Protocol):
    """audio.speech.SpeechService as the speech routes use it."""

    @property
    def model_name(self) -> str: ...

    @property
    def residency(self) -> WhisperModelFiles: ...

    sessions: dict[str, LiveSession]
    vad_default: bool

    def options(self, *, language: str | None = None, task: str = "transcribe", **kwargs: Any) -> TranscribeOptions: ...

    def token_counts(self, prompt: str | None, text: str, seconds: float) -> TokenCounts: ...

    def transcribe_stream(self, pcm: np.ndarray,
                          options: TranscribeOptions) -> AsyncGenerator[list[Segment] | Transcript, None]: ...

    async def transcribe(self, pcm: np.ndarray, options: TranscribeOptions) -> Transcript: ...

    def create_session(self, options: TranscribeOptions, *, expires: bool = True,
                       owner: str | None = None) -> LiveSession: ...

    def get_session(self, session_id: str) -> LiveSession: ...

    def delete_session(self, session_id: str) -> None: ...

    def stop(self) -> None:
        """The server's grace period is over: Whisper work in flight ends with SpeechStopped. Raises nothing."""
        ...

    def stats(self) -> dict[str, Any]: ...
