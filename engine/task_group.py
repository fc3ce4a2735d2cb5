"""TasksOnlyGroup — an ExecutionGroup with no LLM rows, for a transcription-only server and the CLI."""

from __future__ import annotations

from engine.tasks import ExecutionTasks

__all__ = ["TasksOnlyGroup"]


class TasksOnlyGroup:
    """Runs ExecutionTasks (Whisper windows, model loads) and nothing else."""

    max_iteration_tokens = 0
    minimum_preparation_tokens = 0

    def __init__(self) -> None:
        self.tasks = ExecutionTasks()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def prune(self) -> None:
        self.tasks.prune()

    def has_work(self) -> bool:
        return self.tasks.pending

    async def wait_for_work(self) -> None:
        if not self._closed and not self.tasks.pending:
            await self.tasks.wait_changed()

    def admit(self) -> None:
        pass

    def has_decoding(self) -> bool:
        return False

    def has_preparing(self) -> bool:
        return False

    def supports_mixed(self) -> bool:
        return False

    def running_tokens(self) -> int:
        return 0

    def prefill_tokens(self) -> int:
        return 0

    async def advance_mixed(self, budget: int) -> None:
        """Never called: the driver only advances rows that exist. Raises RuntimeError."""
        raise RuntimeError("TasksOnlyGroup has no rows")

    async def advance_preparation(self) -> None:
        """Never called (no rows). Raises RuntimeError."""
        raise RuntimeError("TasksOnlyGroup has no rows")

    async def advance(self) -> None:
        """Never called (no rows). Raises RuntimeError."""
        raise RuntimeError("TasksOnlyGroup has no rows")

    def close(self) -> None:
        """Stop; queued tasks are rejected and waiters woken. Raises nothing."""
        self._closed = True
        self.tasks.reject_all()
