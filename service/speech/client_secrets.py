"""Client secrets: short-lived keys a page's backend mints (`POST /v1/realtime/client_secrets`, or the beta
`POST /v1/realtime/transcription_sessions`) and hands to the page, which opens a live socket with one.

A browser cannot set headers on a websocket, so it offers its key as the `openai-insecure-api-key.<key>`
subprotocol, where any script on the page can read it: a minted secret limits what leaks to a few minutes of live
sockets. As OpenAI's, a secret opens any number of sockets until `expires_at`, and nothing else (no HTTP route);
each socket it opens belongs to the key that minted it and starts with the settings given at minting, as if they
were its first session update.
"""

from __future__ import annotations

import copy
import hashlib
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from service.speech.realtime_config import Dialect

__all__ = ["ClientSecrets", "ClientSecret", "PREFIX", "MAX_PER_OWNER", "MAX_SESSION_BYTES"]

PREFIX = "ek_"  # OpenAI's look for an ephemeral key
# Secrets kept per minting key; past it the oldest is dropped (a secret is usually used within seconds of minting,
# so dropping old ones costs little, and one key's minting never pushes out another key's secrets).
MAX_PER_OWNER = 1024
# The most JSON a secret's session settings may take (a Whisper prompt is ~1 KB): bounds the store's memory.
MAX_SESSION_BYTES = 64 * 1024


@dataclass(frozen=True)
class ClientSecret:
    """What a minted secret grants."""

    owner: str | None  # the id of the key that minted it (None: a server without keys)
    expires_at: int  # unix seconds; refused from then on
    session: dict[str, Any] | None  # settings applied to each socket it opens, as that socket's first update
    dialect: Dialect  # the shape `session` is written in


class ClientSecrets:
    """The minted secrets of one app, kept by their SHA-256 digest only (the store never holds a usable secret)."""

    def __init__(self, per_owner: int = MAX_PER_OWNER, clock: Callable[[], float] = time.time) -> None:
        self.per_owner = per_owner
        self.clock = clock  # unix time; tests move it
        self._secrets: OrderedDict[bytes, ClientSecret] = OrderedDict()  # minting order

    def __len__(self) -> int:
        return len(self._secrets)

    def mint(self, owner: str | None, seconds: int, session: dict[str, Any] | None,
             dialect: Dialect) -> tuple[str, ClientSecret]:
        """A new secret valid for `seconds` (and what it grants). Drops expired secrets, then `owner`'s oldest
        while it holds `per_owner`. Raises nothing."""
        now = self.clock()
        self._drop_expired(now)
        mine = [digest for digest, secret in self._secrets.items() if secret.owner == owner]
        for digest in mine[:max(0, len(mine) - self.per_owner + 1)]:
            del self._secrets[digest]
        value = PREFIX + secrets.token_urlsafe(32)
        secret = ClientSecret(owner=owner, expires_at=int(now) + seconds, session=copy.deepcopy(session),
                              dialect=dialect)
        self._secrets[_digest(value.encode())] = secret
        return value, secret

    def find(self, value: bytes | str) -> ClientSecret | None:
        """The unexpired secret `value` is, else None. Raises nothing."""
        raw = value.encode("latin-1", "replace") if isinstance(value, str) else value
        if not raw.startswith(PREFIX.encode()):
            return None
        secret = self._secrets.get(_digest(raw))
        if secret is None or self.clock() >= secret.expires_at:
            return None
        return secret

    def expired(self, value: bytes) -> bool:
        """Whether `value` is a secret this store minted that has expired (the log says so). Raises nothing."""
        secret = self._secrets.get(_digest(value))
        return secret is not None and self.clock() >= secret.expires_at

    def _drop_expired(self, now: float) -> None:
        for digest in [d for d, s in self._secrets.items() if now >= s.expires_at]:
            del self._secrets[digest]


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()
