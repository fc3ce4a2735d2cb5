"""X-Forwarded-For, believed from trusted proxies only (uvicorn's --forwarded-allow-ips rule), for the access log."""

from __future__ import annotations

from typing import Any

import pytest

from service.http.forwarded import TrustedProxies


def _scope(peer: str | None, *forwarded: str) -> dict[str, Any]:
    return {"type": "http", "client": (peer, 50000) if peer else None,
            "headers": [(b"x-forwarded-for", value.encode("latin-1")) for value in forwarded]}


@pytest.mark.parametrize("trusted, peer, forwarded, expected", [
    # A proxy on this machine (the default) names the client.
    (["127.0.0.1"], "127.0.0.1", ["203.0.113.7"], ("203.0.113.7", "127.0.0.1")),
    # The right-most entry that is not a trusted proxy: what a client put before it is not believed.
    (["127.0.0.1", "10.0.0.0/8"], "127.0.0.1", ["198.51.100.1, 203.0.113.7, 10.1.2.3"], ("203.0.113.7", "127.0.0.1")),
    # Two header lines are one list.
    (["127.0.0.1"], "127.0.0.1", ["198.51.100.1", "203.0.113.7"], ("203.0.113.7", "127.0.0.1")),
    # Every entry a trusted proxy: the left-most; "*": the left-most, as uvicorn.
    (["127.0.0.1", "10.0.0.0/8"], "127.0.0.1", ["10.0.0.5, 10.0.0.6"], ("10.0.0.5", "127.0.0.1")),
    (["*"], "192.0.2.9", ["198.51.100.1, 203.0.113.7"], ("198.51.100.1", "192.0.2.9")),
    (["::1"], "::1", ["2001:db8:0:0::1"], ("2001:db8::1", "::1")),
    # An untrusted peer's header is never believed.
    (["127.0.0.1"], "192.0.2.9", ["203.0.113.7"], ("192.0.2.9", None)),
    # No header, an empty one, or one whose client is no address (a name, a zone, text for the log): the peer.
    (["127.0.0.1"], "127.0.0.1", [], ("127.0.0.1", None)),
    (["127.0.0.1"], "127.0.0.1", [" , "], ("127.0.0.1", None)),
    (["127.0.0.1"], "127.0.0.1", ["client.example"], ("127.0.0.1", None)),
    # A port is left out (Azure Application Gateway sends one), an IPv4-mapped IPv6 shown as the IPv4 it maps.
    (["127.0.0.1"], "127.0.0.1", ["203.0.113.7:4711"], ("203.0.113.7", "127.0.0.1")),
    (["127.0.0.1"], "127.0.0.1", ["[2001:db8::1]:443"], ("2001:db8::1", "127.0.0.1")),
    (["127.0.0.1"], "127.0.0.1", ["[2001:db8::1]"], ("2001:db8::1", "127.0.0.1")),
    (["127.0.0.1"], "127.0.0.1", ["::ffff:203.0.113.9"], ("203.0.113.9", "127.0.0.1")),
    (["127.0.0.1"], "127.0.0.1", ["[::ffff:203.0.113.9]:80"], ("203.0.113.9", "127.0.0.1")),
    # ... and so is a trusted proxy's address, in the header or as the peer (a dual-stack socket's).
    (["127.0.0.1", "10.0.0.0/8"], "127.0.0.1", ["203.0.113.7:1, 10.0.0.5:2"], ("203.0.113.7", "127.0.0.1")),
    (["127.0.0.1"], "::ffff:127.0.0.1", ["203.0.113.7"], ("203.0.113.7", "::ffff:127.0.0.1")),
    (["::ffff:127.0.0.0/104"], "127.0.0.1", ["203.0.113.7"], ("203.0.113.7", "127.0.0.1")),
    # Not an address with a port: junk stays out.
    (["127.0.0.1"], "127.0.0.1", ["[203.0.113.7]:80"], ("127.0.0.1", None)),
    (["127.0.0.1"], "127.0.0.1", ["203.0.113.7:port"], ("127.0.0.1", None)),
    (["127.0.0.1"], "127.0.0.1", ["[2001:db8::1]:443:1"], ("127.0.0.1", None)),
    (["127.0.0.1"], "127.0.0.1", ["2001:db8::1:443"], ("2001:db8::1:443", "127.0.0.1")),  # an IPv6 address whole
    (["127.0.0.1"], "127.0.0.1", ["fe80::1%" + "x" * 500], ("127.0.0.1", None)),
    (["127.0.0.1"], "127.0.0.1", ["1.2.3.4 tandem: POST /v1/fake 200"], ("127.0.0.1", None)),
    (["127.0.0.1"], None, ["203.0.113.7"], ("-", None)),
])
def test_the_client_a_trusted_proxy_names(trusted: list[str], peer: str | None, forwarded: list[str],
                                          expected: tuple[str, str | None]) -> None:
    assert TrustedProxies(trusted).client(_scope(peer, *forwarded)) == expected


@pytest.mark.parametrize("entry", ["localhost", "10.0.0.0/33", "unix:/tmp/sock", "1.2.3"])
def test_an_entry_that_is_no_address_is_refused(entry: str) -> None:
    with pytest.raises(ValueError, match="not an IP address or network"):
        TrustedProxies(["127.0.0.1", entry])
