"""Speech routes: file transcription, live dictation sessions, the /v1/audio/live websocket, and the
lifespan hook that serves a Whisper model on the engine's task queue."""

__all__: list[str] = []
