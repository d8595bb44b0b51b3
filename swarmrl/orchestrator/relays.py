"""Which relay URLs the orchestrator accepts before advertising them to workers.

A registered relay's URL goes to every worker in `/v1/run/servers`, and workers
poll it. A key could register `http://169.254.169.254/...` (a cloud metadata
service), a private address inside the operator's network, or a third party's
host, and aim every worker at it. So the host must resolve, and every address
it resolves to must be public (`ipaddress`'s `is_global`) or inside one of
`orchestrator.relay_networks` (the operator's own ranges, e.g. 127.0.0.0/8 for
a swarm on one machine). Anything else is refused at registration (403).

An accepted URL is not advertised yet: the orchestrator first fetches a
manifest of the run from it and verifies it (orchestrator/relaycheck.py). That
check asks `vetted_addresses` again right before each fetch and connects only
to the addresses it vetted, so a name that resolves to a public address at
registration and to a private one later (DNS rebinding) does not turn the
orchestrator's own fetch toward the private one.

Not covered here: workers resolve the name themselves when they fetch, and a
name may resolve elsewhere for them than for the orchestrator; an operator who
fears this should register relays by address. A relay that serves a valid
manifest to the orchestrator and bad shards to workers is caught by the
workers' own per-shard checks, and their reports (`orchestrator.relay_reports`).
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from swarmrl.orchestrator.service import ApiError


class Refused(ValueError):
    """Why a URL may not be advertised as a relay."""


def refusal(url: str, networks: list[str]) -> str | None:
    """Why `url` may not be advertised as a relay, or None if it may."""
    try:
        vetted_addresses(url, networks)
    except Refused as e:
        return str(e)
    return None


def vetted_addresses(url: str, networks: list[str]) -> set:
    """The addresses `url`'s host names now, each public or inside `networks`;
    Refused (naming the first that is not) otherwise."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as e:
        raise Refused(f"malformed URL ({e})") from None
    if parts.scheme not in ("http", "https") or not host:
        raise Refused("a relay URL is http(s)://HOST[:PORT][/PATH]")
    if port is None and ":" in parts.netloc.rsplit("]", 1)[-1]:
        raise Refused("malformed port")
    try:
        addresses = resolve(host, port or 80)
    except (OSError, UnicodeError) as e:
        raise Refused(f"host {host!r} does not resolve ({e})") from None
    allowed = [ipaddress.ip_network(n, strict=False) for n in networks]
    judged = addresses | {v4 for a in addresses if (v4 := _embedded_ipv4(a)) is not None}
    for a in sorted(judged, key=str):
        if any(a.version == n.version and a in n for n in allowed):
            continue
        if not a.is_global or a.is_multicast:
            raise Refused(
                f"{a} is {_kind(a)}; the operator allows such addresses in "
                "orchestrator.relay_networks"
            )
    return addresses


def resolve(host: str, port: int = 80) -> set:
    """The addresses `host` names: itself if it is one, else what it resolves to now."""
    try:
        return {ipaddress.ip_address(host)}
    except ValueError:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        return {ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos}


def check(url: str, networks: list[str]) -> None:
    """ApiError 403 if `url` may not be advertised as a relay."""
    why = refusal(url, networks)
    if why is not None:
        raise ApiError(403, f"relay URL {url[:200]} refused: {why}")


NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _embedded_ipv4(a):
    """The IPv4 address an IPv6 address carries (mapped, 6to4, Teredo, NAT64), if any:
    each is refused or allowed as that IPv4 address would be."""
    if a.version != 6:
        return None
    if a.ipv4_mapped is not None:
        return a.ipv4_mapped
    if a.sixtofour is not None:
        return a.sixtofour
    if a.teredo is not None:
        return a.teredo[1]
    if a in NAT64:
        return ipaddress.ip_address(int(a) & 0xFFFFFFFF)
    return None


def _kind(a) -> str:
    for name in ("unspecified", "loopback", "link_local", "multicast", "private", "reserved"):
        if getattr(a, f"is_{name}"):
            return name.replace("_", "-")
    return "not a public address"
