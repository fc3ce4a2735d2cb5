"""Which container a body opens with, by its signature: a file is decoded as what it is whatever type its upload
declared (OpenAI decides by the file itself; a WAV sent as `audio/L16` was read as raw samples, header and all).

Fixed signatures are 4+ bytes raw PCM does not start with by chance; an mp3 without an ID3 tag and ADTS AAC have
only a frame sync, which a PCM sample of -1 matches, so three valid frame headers in a row are asked of them (PCM
repeating exactly every few samples from its first, a synthetic pattern, could still pass: then the file's decode
fails, a 400 naming the file, never text from misread samples).
"""

from __future__ import annotations

__all__ = ["container_kind", "signature_start"]

# (kind, offset, signature, offset of a second signature or -1, the second signatures it may be)
_SIGNATURES: tuple[tuple[str, int, bytes, int, tuple[bytes, ...]], ...] = (
    ("wav", 0, b"RIFF", 8, (b"WAVE",)),
    ("wav", 0, b"RF64", 8, (b"WAVE",)),
    ("wav", 0, b"BW64", 8, (b"WAVE",)),
    ("aiff", 0, b"FORM", 8, (b"AIFF", b"AIFC")),
    ("caf", 0, b"caff", -1, ()),
    ("ogg", 0, b"OggS", -1, ()),
    ("flac", 0, b"fLaC", -1, ()),
    ("mp3", 0, b"ID3", -1, ()),
    ("mp4", 4, b"ftyp", -1, ()),
    ("matroska", 0, b"\x1a\x45\xdf\xa3", -1, ()),
    ("amr", 0, b"#!AMR", -1, ()),
    ("asf", 0, b"\x30\x26\xb2\x75\x8e\x66\xcf\x11", -1, ()),
    ("au", 0, b".snd", -1, ()),  # Sun's .au, what `audio/basic` usually names: its header is no μ-law samples
)

# MPEG audio Layer III bitrates in kbit/s for indexes 1-14, MPEG-1 and MPEG-2/2.5; sample rates by version
_BITRATES = {
    True: (32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    False: (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}
_FRAMES = 3  # headers in a row that make a frame-sync stream


def container_kind(body: bytes) -> str | None:
    """The container `body` opens with ("wav", "mp3", "mp4", ...), or None (raw samples, or nothing known). Raises
    nothing."""
    for kind, at, signature, second_at, seconds in _SIGNATURES:
        if body[at:at + len(signature)] == signature and (
                second_at < 0 or body[second_at:second_at + 4] in seconds):
            return kind
    for kind, frame_length in (("mp3", _mpeg_frame_length), ("aac", _adts_frame_length)):
        at = 0
        for _ in range(_FRAMES):
            length = frame_length(body[at:at + 7])
            if length is None:
                break
            at += length
        else:
            return kind
    return None


def signature_start(body: bytes) -> bool:
    """Whether `body` may be a fixed signature cut short (`RIFF` of `RIFF....WAVE`, a pipe's first read): shorter
    than one needs, with at least one of its bytes, and each byte it has where it has one the same. Raises nothing."""
    for _, at, signature, second_at, seconds in _SIGNATURES:
        end = max(at + len(signature), second_at + 4)
        if not at < len(body) < end or not signature.startswith(body[at:at + len(signature)]):
            continue
        if second_at < 0 or len(body) <= second_at or any(s.startswith(body[second_at:]) for s in seconds):
            return True
    return False


def _mpeg_frame_length(h: bytes) -> int | None:
    """The length of the MPEG audio frame whose header `h` opens, or None if it is none. Raises nothing."""
    if len(h) < 4 or h[0] != 0xFF or h[1] & 0xE0 != 0xE0:
        return None
    # version 1 is reserved; layer bits 01 are Layer III, the only layer taken (mp3: what clients send)
    version, layer_bits = (h[1] >> 3) & 3, (h[1] >> 1) & 3
    bitrate_index, rate_index, padding = h[2] >> 4, (h[2] >> 2) & 3, (h[2] >> 1) & 1
    if version == 1 or layer_bits != 1 or bitrate_index in (0, 15) or rate_index == 3:
        return None
    bitrate = _BITRATES[version == 3][bitrate_index - 1] * 1000
    return (144 if version == 3 else 72) * bitrate // _RATES[version][rate_index] + padding


def _adts_frame_length(h: bytes) -> int | None:
    """The length of the ADTS (AAC) frame whose header `h` opens, or None if it is none. Raises nothing."""
    if len(h) < 7 or h[0] != 0xFF or h[1] & 0xF6 != 0xF0 or (h[2] >> 2) & 0xF > 12:
        return None
    length = ((h[3] & 3) << 11) | (h[4] << 3) | (h[5] >> 5)
    return length if length >= 7 else None
