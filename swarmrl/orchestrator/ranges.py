"""Address ranges: who counts as one party when the orchestrator shares something out.

Keys are free and a proof of work costs seconds, so a share per key is a share per
attacker's wish. What costs an attacker more is addresses: a subscriber, a cloud
instance or a small provider usually holds one IPv4 /24 at most, or one IPv6 /48
(the usual end-site assignment). The faucet, the probation pool and the live
relays are shared per such range (`orchestrator.range_share`, admission.py,
relaystanding.py), so keys from one range leave the rest to newcomers from others.

A loopback address counts alone (127.0.0.2 is not 127.0.0.3): loopback peers are
on the orchestrator's own machine, where the operator's processes and tests stand
for separate parties. A peer that is not an IP address (a test client) counts by
its name; one with no address at all (a Unix socket: '') is in no range, and only
the run's own limits apply to it. An IPv4-mapped IPv6 address counts as its IPv4
address. The peer is the connection's: X-Forwarded-For is not read
(connections.server_config), since any local process could set it.

What this does not stop: an attacker with many ranges (a botnet, a large cloud
account) holds a share in each; and behind a reverse proxy every peer is the proxy,
which then must be told apart by the proxy itself.
"""

from __future__ import annotations

import ipaddress

IPV4_PREFIX = 24
IPV6_PREFIX = 48


def address_range(host: str) -> str:
    """The range `host` (a connection's peer address) counts in: '198.51.100.0/24',
    '2001:db8:1::/48', a loopback address alone, or the host itself if not an IP."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return f"{ip}/{ip.max_prefixlen}"
    prefix = IPV4_PREFIX if ip.version == 4 else IPV6_PREFIX
    return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))
