"""Which relay URLs the orchestrator accepts before advertising them to workers.

A registered relay's URL goes to every worker in `/v1/run/servers`, and workers
poll it. A key could register `http://169.254.169.254/...` (a cloud metadata
service), a private address inside the operator's network, or a third party's
host, and aim every worker at it. So the host must resolve, and every address
it resolves to must be public, or inside one of `orchestrator.relay_networks`
(the operator's own ranges of the same IP version, e.g. 127.0.0.0/8 for a
swarm on one machine). Anything else is refused at registration (403).

Public means: not in `SPECIAL_IPV4` or `SPECIAL_IPV6` below, and for IPv6
inside 2000::/3 (global unicast). The tables follow the IANA IPv4 and IPv6
Special-Purpose Address Registries, plus the ranges those registries leave to
other documents (IPv4 multicast, IPv6 multicast, site-local, IPv4-compatible
and IPv4-translated addresses). They are written out here rather than taken
from `ipaddress`'s `is_global`, because `is_global` calls some of these forms
global (::/96 and ::ffff:0:0:0/96, which carry an IPv4 address such as
127.0.0.1) and its answers differ between Python releases; the table gives the
same answer on every Python and can be read and reviewed in one place. Every
IPv6 address outside 2000::/3 is refused whether or not the table names its
range, so a form the table misses is refused too. A refusal names the most
specific range the address lies in.

An IPv6 address that carries an IPv4 address (IPv4-mapped, 6to4, Teredo,
NAT64 64:ff9b::/96) is also judged as that IPv4 address, so an operator who
allows one of those IPv6 ranges still does not let it reach a refused IPv4
address; without such an allowance the IPv6 form is refused by its own range.

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


def _table(*rows: tuple[str, str]) -> tuple:
    return tuple((ipaddress.ip_network(net), name) for net, name in rows)


# IPv4 addresses that are not public unicast (IANA IPv4 Special-Purpose Address
# Registry, and the multicast block); anything else is public.
SPECIAL_IPV4 = _table(
    ("0.0.0.0/8", "this network"),
    ("0.0.0.0/32", "unspecified"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "shared address space"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation TEST-NET-1"),
    ("192.31.196.0/24", "AS112"),
    ("192.52.193.0/24", "AMT"),
    ("192.88.99.0/24", "deprecated 6to4 relay anycast"),
    ("192.168.0.0/16", "private"),
    ("192.175.48.0/24", "AS112 direct delegation"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation TEST-NET-2"),
    ("203.0.113.0/24", "documentation TEST-NET-3"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
    ("255.255.255.255/32", "limited broadcast"),
)

# IPv6 ranges named in refusals (IANA IPv6 Special-Purpose Address Registry, and
# the forms defined elsewhere). Those outside 2000::/3 are refused anyway; those
# inside it are the exceptions to global unicast.
SPECIAL_IPV6 = _table(
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::/96", "deprecated IPv4-compatible"),
    ("::ffff:0:0/96", "IPv4-mapped"),
    ("::ffff:0:0:0/96", "IPv4-translated"),
    ("64:ff9b::/96", "NAT64 well-known prefix"),
    ("64:ff9b:1::/48", "NAT64 local-use prefix"),
    ("100::/64", "discard-only"),
    ("100:0:0:1::/64", "dummy prefix"),
    ("2001::/23", "IETF protocol assignments"),
    ("2001::/32", "Teredo"),
    ("2001:2::/48", "benchmarking"),
    ("2001:3::/32", "AMT"),
    ("2001:4:112::/48", "AS112"),
    ("2001:10::/28", "deprecated ORCHID"),
    ("2001:20::/28", "ORCHIDv2"),
    ("2001:30::/28", "drone remote ID tags"),
    ("2001:db8::/32", "documentation"),
    ("2002::/16", "6to4"),
    ("2620:4f:8000::/48", "AS112 direct delegation"),
    ("3fff::/20", "documentation"),
    ("5f00::/16", "SRv6 SIDs"),
    ("fc00::/7", "unique-local"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "deprecated site-local"),
    ("ff00::/8", "multicast"),
)

GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")
NAT64 = ipaddress.ip_network("64:ff9b::/96")
ALLOWING = "; the operator allows such addresses in orchestrator.relay_networks"


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
    Refused (naming the first that is not, and its range) otherwise."""
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
    for a in sorted(addresses, key=lambda a: (a.version, int(a))):
        v4 = _embedded_ipv4(a)
        if v4 is not None and (why := _outside(v4, allowed)) is not None:
            raise Refused(f"{a} carries {v4}, which is {why}{ALLOWING}")
        if (why := _outside(a, allowed)) is not None:
            raise Refused(f"{a} is {why}{ALLOWING}")
    return addresses


def resolve(host: str, port: int = 80) -> set:
    """The addresses `host` names: itself if it is one, else what it resolves to now."""
    try:
        return {ipaddress.ip_address(host)}
    except ValueError:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        return {ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos}


def check(url: str, networks: list[str]) -> set:
    """The addresses `url`'s host names now, or ApiError 403 if `url` may not be
    advertised as a relay."""
    try:
        return vetted_addresses(url, networks)
    except Refused as e:
        raise ApiError(403, f"relay URL {url[:200]} refused: {e}") from None


def _special(a) -> str | None:
    """Why address `a` is not public unicast, as "NAME (RANGE)" for the most specific
    range of the tables it lies in; None if it is public."""
    table = SPECIAL_IPV4 if a.version == 4 else SPECIAL_IPV6
    hits = [(net, name) for net, name in table if a in net]
    if hits:
        net, name = max(hits, key=lambda hit: hit[0].prefixlen)
        return f"{name} ({net})"
    if a.version == 6 and a not in GLOBAL_UNICAST:
        return f"not global unicast (outside {GLOBAL_UNICAST})"
    return None


def _outside(a, allowed: list) -> str | None:
    """Why `a` is refused (see `_special`), or None if it is public or inside `allowed`."""
    if any(a.version == n.version and a in n for n in allowed):
        return None
    return _special(a)


def _embedded_ipv4(a):
    """The IPv4 address an IPv6 address carries (mapped, 6to4, Teredo, NAT64), if any:
    each is also judged as that IPv4 address would be."""
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
