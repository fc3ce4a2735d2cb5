"""API keys and browser origins: who may call the server.

Keys arrive as `Authorization: Bearer <key>` or `x-api-key: <key>` (a websocket's also as the subprotocol
`openai-insecure-api-key.<key>`, as OpenAI's browser clients send it: a browser cannot set headers on one) and are
compared in constant time against every configured key; a websocket may present a client secret a key minted
instead (service/speech/client_secrets.py). A matched key is known afterwards only by its id (a digest prefix), which
names its prefix-cache namespace and owns the sessions it creates. Origins: a request carrying an
`Origin` header is served only when that origin is allowed or is the server itself. Hosts: a keyless server on a
loopback address answers only Host names that mean this machine (Ollama's rule), so a page whose domain an attacker
re-points at 127.0.0.1 (DNS rebinding) is not "the server itself".
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import socket
from typing import Any, Iterable, Mapping
from urllib.parse import urlsplit

from litestar.connection import ASGIConnection
from litestar.types import Method

from service.speech.client_secrets import ClientSecrets
from service.state import scope_state

__all__ = ["KeyRing", "client_key", "set_client_key", "offered_key", "subprotocols", "origin_allowed", "host_allowed",
           "is_loopback", "header", "CLIENT_KEY", "KEY_PROTOCOL", "EXPOSED_HEADERS", "CORS_METHODS"]

# Response headers a page's script may read (CORS): the SDKs act on x-should-retry and report x-request-id; hidden,
# the openai SDK in a browser retried a 504 the server said not to retry.
EXPOSED_HEADERS = ["retry-after", "x-request-id", "x-should-retry"]
# The methods a page's script may use (CORS): the API's own; HEAD as every GET route answers it (a browser
# preflights a HEAD that carries Authorization).
CORS_METHODS: list[Method] = ["GET", "HEAD", "POST", "DELETE", "OPTIONS"]
# Name suffixes that resolve only on this machine or network (RFC 6761 .localhost, mDNS .local, .internal).
_LOCAL_SUFFIXES = (".localhost", ".local", ".internal")

# Where the guard leaves the matched key's id in the ASGI scope's state.
CLIENT_KEY = "tandem.client_key"
# The websocket subprotocol OpenAI's browser clients carry their key in: `openai-insecure-api-key.<key>`.
KEY_PROTOCOL = "openai-insecure-api-key."

_log = logging.getLogger("tandem.auth")


def header(scope: Mapping[str, Any], name: bytes) -> str | None:
    """The first value of header `name` (lower-case bytes) in an ASGI scope, decoded. Raises nothing."""
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


class KeyRing:
    """The configured API keys. Empty: no auth."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = [key.encode() for key in dict.fromkeys(keys) if key]
        self._ids = {self.key_id(key) for key in self._keys}

    def __bool__(self) -> bool:
        return bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    @staticmethod
    def key_id(key: bytes) -> str:
        """A stable, non-reversible name for a key (logs, namespaces). Raises nothing."""
        return "key-" + hashlib.sha256(key).hexdigest()[:16]

    def match(self, scope: Mapping[str, Any]) -> str | None:
        """The id of the key the request presents, or None when it presents none that is configured.
        Every key is compared (hmac.compare_digest), so the time taken does not say which one nearly
        matched. A websocket may present a client secret instead: the id is then that of the key that minted
        it. Raises nothing."""
        offered = offered_key(scope)
        if offered is None:
            return None
        found: str | None = None
        for key in self._keys:
            if hmac.compare_digest(offered, key):
                found = self.key_id(key)
        if found is None and scope.get("type") == "websocket":
            found = self._secret_owner(scope, offered)
        return found

    def _secret_owner(self, scope: Mapping[str, Any], offered: bytes) -> str | None:
        store = _client_secrets(scope)
        if store is None:
            return None
        secret = store.find(offered)
        if secret is None and store.expired(offered):  # said in the log: the handshake's 403 has no body
            _log.info("websocket %s: the client secret offered has expired", scope.get("path", ""))
        return secret.owner if secret is not None and secret.owner in self._ids else None


def _client_secrets(scope: Mapping[str, Any]) -> ClientSecrets | None:
    # The guard builds its ring from the configured keys alone; minted secrets live in the state of the app serving
    # the connection (Litestar puts itself in the scope before the guard runs).
    app_state = scope_state(scope)
    return app_state.client_secrets if app_state is not None else None


def subprotocols(scope: Mapping[str, Any]) -> list[str]:
    """The websocket subprotocols the client offered (ASGI's `subprotocols`, else its Sec-WebSocket-Protocol
    header). Raises nothing."""
    offered = scope.get("subprotocols")
    if offered is None:
        offered = (header(scope, b"sec-websocket-protocol") or "").split(",")
    return [p.strip() for p in offered if isinstance(p, str) and p.strip()]


def offered_key(scope: Mapping[str, Any]) -> bytes | None:
    """The key a request presents: `Authorization: Bearer`, `x-api-key`, or on a websocket the subprotocol
    `openai-insecure-api-key.<key>`. Raises nothing."""
    if (value := header(scope, b"authorization")) is not None:
        scheme, _, token = value.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip().encode("latin-1")
    if (value := header(scope, b"x-api-key")) is not None and value.strip():
        return value.strip().encode("latin-1")
    if scope.get("type") == "websocket":
        for protocol in subprotocols(scope):
            if protocol.startswith(KEY_PROTOCOL) and len(protocol) > len(KEY_PROTOCOL):
                return protocol[len(KEY_PROTOCOL):].encode("latin-1", "replace")
    return None


def set_client_key(scope: Any, key_id: str | None) -> None:
    """Record the matched key's id for the routes. Raises nothing."""
    scope.setdefault("state", {})[CLIENT_KEY] = key_id


def client_key(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    """The id of the API key this request authenticated with (None without auth). Raises nothing."""
    value = connection.scope.get("state", {}).get(CLIENT_KEY)
    return value if isinstance(value, str) else None


def origin_allowed(origin: str, scope: Mapping[str, Any], allowed: Iterable[str]) -> bool:
    """True when `origin` may use the server: listed in `allowed` ("*" allows any), or the server's own
    origin (same scheme-less host and port as the request's Host header). Raises nothing."""
    allowed = list(allowed)
    if "*" in allowed or origin.rstrip("/") in (o.rstrip("/") for o in allowed):
        return True
    host = header(scope, b"host")
    try:
        return host is not None and urlsplit(origin).netloc.lower() == host.lower()
    except ValueError:
        return False


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses. Raises nothing."""
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_allowed(scope: Mapping[str, Any], listening_on: str, keyed: bool, allowed: Iterable[str]) -> bool:
    """Whether the request's Host header may be served. Only a keyless server on a loopback address checks it (a
    rebound page cannot guess a key; one listening elsewhere was meant to be reached by any name): the name must
    be a loopback, private or unspecified address, a dotless name (localhost), a name under .localhost / .local /
    .internal, this machine's hostname, or listed in `allowed` ("*": any). No Host (HTTP/1.0) passes. Raises nothing."""
    if keyed or not is_loopback(listening_on):
        return True
    value = header(scope, b"host")
    if value is None or not value.strip():
        return True
    allowed = [a.lower() for a in allowed]
    if "*" in allowed:
        return True
    try:
        name = (urlsplit("//" + value.strip()).hostname or "").lower().rstrip(".")
    except ValueError:
        return False
    try:
        address = ipaddress.ip_address(name)
        return address.is_loopback or address.is_private or address.is_unspecified or name in allowed
    except ValueError:
        pass
    # A dotless name (a test client's "testserver", an intranet box) is no domain an attacker's DNS answers for.
    return (name in allowed or "." not in name or name.endswith(_LOCAL_SUFFIXES)
            or name == socket.gethostname().lower())
