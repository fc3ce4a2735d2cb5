"""What a client's requests do to a live transcription's open audio (audio/live.py LiveTranscription builds on it):
`clear()` drops what has no committed text; `retune()` takes a session's new options for the utterances that begin
after it, so the utterance being spoken keeps the language and prompt it began with and none is decoded across the
change (audio/utterances.py holds the options until their utterance comes).
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import TYPE_CHECKING

from audio.agreement import LiveText
from audio.buffers import AudioBuffer
from audio.decoding import WindowedTranscription
from audio.timeline import Timeline
from audio.transcript import TranscribeOptions
from audio.utterances import Utterances

__all__ = ["LiveRequests"]


# Read elsewhere, at once: the gate's settings (audio/session_pump.py), the input filter (audio/sessions.py), and
# whether decodes keep token log probabilities and how many must agree (LiveTranscription.logprobs and .agreement, set
# by LiveSession.reconfigure).
_NOT_DECODING = ("noise_reduction", "logprobs", "agreement")


def _decoding(options: TranscribeOptions) -> TranscribeOptions:
    """`options` less what is not how an utterance is decoded (`_NOT_DECODING`, the gate's). Raises nothing."""
    return replace(options, **{f.name: getattr(TranscribeOptions, f.name) for f in fields(TranscribeOptions)
                               if f.name.startswith("vad") or f.name in _NOT_DECODING})


class LiveRequests:
    """clear() and retune() over LiveTranscription's state (set up by its __init__)."""

    options: TranscribeOptions
    _asked: TranscribeOptions  # the options asked for last
    utterances: Utterances
    timeline: Timeline
    _open: AudioBuffer
    _tr: WindowedTranscription | None
    _live: LiveText | None
    _probed_at: int
    _decoded_to: int
    _final_to: int

    if TYPE_CHECKING:  # LiveTranscription's
        @property
        def has_open(self) -> bool: ...
        def _seek(self) -> int: ...
        def _finish_all(self, limit: int) -> None: ...
        def _set_tentative(self, tokens: list[int]) -> None: ...
        def add_pause(self, hard: bool = False) -> int: ...

    def clear(self) -> None:
        """Drop the open utterance's audio not yet transcribed into committed text: behind (pauses pending)
        or without committed text, its audio goes and it stays open, empty; with committed text, that text
        stays and the utterance closes with it (the audio after it is skipped). Raises nothing."""
        tr, live = self._tr, self._live
        if live is not None:
            live.previous = None
        if self.utterances.pauses or not self.utterances.text:
            u = self.utterances
            cut = u.pauses[-1] if u.pauses else max(self._final_to, self._seek(), u.open_from)
            self.timeline.truncate(cut)
            self._open.truncate(cut)
            self._probed_at = min(self._probed_at, cut)
            self._decoded_to = min(self._decoded_to, cut)
            self.utterances.reopen(cut)  # emptied, it begins again: options asked for meanwhile are its own
        else:
            length = self.timeline.length
            if tr is not None and live is not None:
                self._finish_all(length)
            self._final_to = self._probed_at = self._decoded_to = length
            self.add_pause()
            self.utterances.close(len(self.utterances.pauses))
        self._set_tentative([])

    def retune(self, options: TranscribeOptions) -> None:
        """Decode the utterances that begin from here with `options` (a session's update): the open one, if it
        has audio or text, keeps what it began with. Raises nothing."""
        if _decoding(options) != _decoding(self._asked):
            self.utterances.ask(options, self.has_open)
        self._asked = options

    def _begin(self, at: int, options: TranscribeOptions) -> None:
        """Decode from `at`, where the utterances asked for with `options` begin (every utterance before it is
        closed): the text before it is finished there, its audio no context for theirs. Raises nothing."""
        self.options = options
        tr = self._tr
        if tr is not None and self._live is not None:  # else start() binds them with these options
            self._finish_all(at)
            self._final_to, self._probed_at = max(self._final_to, at), max(self._probed_at, at)
            tr.retarget(options)
            # Conditioned on the new prompt alone: the earlier text, written without it, outweighed it ("Ten of
            # Clov's." before a prompt naming Clubs kept the next card "Queen of Clov's"; alone: "Queen of Clubs").
            tr.prompt_reset_since = len(tr.all_tokens)
            self._live.tokenizer = tr.tokenizer
