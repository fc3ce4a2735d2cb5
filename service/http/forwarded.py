"""Who a request came from behind a reverse proxy: the client an `X-Forwarded-For` names, believed only from a peer
listed in `--forwarded-allow-ips` (uvicorn's flag and rule: the right-most entry that is not itself a trusted proxy;
every entry trusted, the left-most). Only the access log reads it: nothing decides access by the client address."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Iterable, Mapping

__all__ = ["TrustedProxies", "DEFAULT_FORWARDED_ALLOW_IPS"]

# uvicorn's default: a proxy on this machine.
DEFAULT_FORWARDED_ALLOW_IPS = ("127.0.0.1",)

# An entry as an address is written (no IPv6 zone): the longest, an IPv4-mapped IPv6, has 45 characters. Anything
# else is ignored, so a client's text never reaches the log line through the header.
_ADDRESS_TEXT = re.compile(r"[0-9A-Fa-f:.]{2,45}")
# An entry with its port, as some proxies send it (Azure Application Gateway): `a.b.c.d:port`, `[IPv6]:port`; the
# brackets alone too.
_WITH_PORT = re.compile(r"(?P<v4>[0-9.]{7,15}):[0-9]{1,5}|\[(?P<v6>[0-9A-Fa-f:.]{2,45})\](?::[0-9]{1,5})?")

_Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _address(text: str) -> _Address | None:
    """`text` as an IP address, its port left out, an IPv4-mapped IPv6 (`::ffff:203.0.113.9`) as the IPv4 one it
    maps; None when it is not one (a zone, a name, junk). Raises nothing."""
    bracketed = False
    if port := _WITH_PORT.fullmatch(text):
        text, bracketed = port["v4"] or port["v6"], port["v6"] is not None
    if not _ADDRESS_TEXT.fullmatch(text):
        return None
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        return address.ipv4_mapped or address
    return None if bracketed else address  # brackets hold an IPv6 address


class TrustedProxies:
    """The peers whose `X-Forwarded-For` is believed: addresses and networks, or every peer ("*")."""

    def __init__(self, entries: Iterable[str] = DEFAULT_FORWARDED_ALLOW_IPS) -> None:
        """`entries`: IP addresses, CIDR networks, or "*". Raises ValueError naming an entry that is none of them."""
        items = [e.strip() for e in entries if e.strip()]
        self.always = "*" in items
        self.networks: list[_Network] = []
        for item in items:
            if item == "*":
                continue
            try:
                network = ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or network (e.g. 10.0.0.0/8), nor '*'") from None
            # IPv4-mapped (::ffff:a.b.c.d/96+): addresses are compared as the IPv4 ones they map, so is this.
            mapped = network.network_address.ipv4_mapped if isinstance(network, ipaddress.IPv6Network) else None
            if mapped is not None and network.prefixlen >= 96:
                network = ipaddress.IPv4Network(f"{mapped}/{network.prefixlen - 96}")
            self.networks.append(network)

    def trusts(self, host: str | None) -> bool:
        """Whether `host` (a peer's or an entry's address text) is a trusted proxy. Raises nothing."""
        if self.always:
            return True
        address = _address(host or "")
        return address is not None and any(address in net for net in self.networks)

    def client(self, scope: Mapping[str, Any]) -> tuple[str, str | None]:
        """(the client, the proxy it came through or None): the peer's address alone unless the peer is trusted and
        its `X-Forwarded-For` names a well-formed client. Raises nothing."""
        peer = scope.get("client")
        host = str(peer[0]) if peer else "-"
        if not peer or not self.trusts(host):
            return host, None
        # Every header line, in order: proxies append to the list, each line being a part of it (RFC 9110 5.3).
        values = [v.decode("latin-1") for k, v in scope.get("headers", ()) if k.lower() == b"x-forwarded-for"]
        entries = [e.strip() for e in ",".join(values).split(",") if e.strip()]
        if not entries:
            return host, None
        forwarded = entries[0] if self.always else \
            next((e for e in reversed(entries) if not self.trusts(e)), entries[0])
        address = _address(forwarded)
        return (str(address), host) if address is not None else (host, None)
