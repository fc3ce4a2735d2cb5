"""Process faults and lifetime: a supervisor that respawns a dead worker (restart policy), workers that die
with their parent, graceful draining on SIGTERM, and cleanup of what an interrupted start left behind.

Kept apart from granian where it can be: the restart policy, the parent-death binding and the in-flight
counter are plain code a supervisor of any child process (the engine under --isolate) can reuse."""

__all__: list[str] = []
