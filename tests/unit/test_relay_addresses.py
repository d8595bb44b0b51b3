"""Which addresses a relay URL may name (orchestrator/relays.py): only public unicast
ones, from the special-purpose ranges written out in the module, or those inside the
operator's `orchestrator.relay_networks`. IP literals and spellings of loopback only:
nothing here queries DNS or connects anywhere."""

from __future__ import annotations

import ipaddress

import pytest

from swarmrl.orchestrator import relays

# The ranges a relay may not name, written from the IANA registries independently of
# the module's tables.
IPV4_REFUSED = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.31.196.0/24",
    "192.52.193.0/24",
    "192.88.99.0/24",
    "192.168.0.0/16",
    "192.175.48.0/24",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "255.255.255.255/32",
]
IPV6_REFUSED = [
    "::/128",
    "::1/128",
    "::/96",
    "::ffff:0:0/96",
    "::ffff:0:0:0/96",
    "64:ff9b::/96",
    "64:ff9b:1::/48",
    "100::/64",
    "2001::/23",
    "2001::/32",
    "2001:2::/48",
    "2001:10::/28",
    "2001:20::/28",
    "2001:db8::/32",
    "2002::/16",
    "2620:4f:8000::/48",
    "3fff::/20",
    "5f00::/16",
    "fc00::/7",
    "fe80::/10",
    "fec0::/10",
    "ff00::/8",
    "::/3",  # everything below 2000::/3
    "4000::/2",
    "8000::/1",  # everything above it
]


def _url(address) -> str:
    a = ipaddress.ip_address(address)
    return f"http://{a}:80/" if a.version == 4 else f"http://[{a}]:80/"


def _first_middle_last(ranges: list[str]) -> list:
    out = []
    for text in ranges:
        net = ipaddress.ip_network(text)
        middle = net.network_address + net.num_addresses // 2
        for where, a in (("first", net[0]), ("middle", middle), ("last", net[-1])):
            out.append(pytest.param(str(a), id=f"{text}-{where}"))
    return out


def _table_ranges() -> list[str]:
    return [str(net) for net, _ in relays.SPECIAL_IPV4 + relays.SPECIAL_IPV6]


@pytest.mark.parametrize("address", _first_middle_last(IPV4_REFUSED + IPV6_REFUSED))
def test_every_address_of_a_special_range_is_refused(address):
    assert relays.refusal(_url(address), []) is not None, address


@pytest.mark.parametrize("address", _first_middle_last(_table_ranges()))
def test_every_range_of_the_module_table_is_refused_at_its_ends_and_middle(address):
    why = relays.refusal(_url(address), [])
    assert why is not None and "(" in why, (address, why)


@pytest.mark.parametrize(
    "host",
    [
        "[::127.0.0.1]",  # IPv4-compatible
        "[::ffff:0:127.0.0.1]",  # IPv4-translated
        "[::ffff:127.0.0.1]",  # IPv4-mapped
        "[64:ff9b::7f00:1]",  # NAT64 around 127.0.0.1
        "[64:ff9b:1::7f00:1]",  # local-use NAT64
        "[2002:7f00:1::1]",  # 6to4 around 127.0.0.1
        "[2001:0:4136:e378:8000:63bf:3fff:fdd2]",  # Teredo
        "[2001:0:4136:e378:8000:63bf:f7f7:f7f7]",  # Teredo around 8.8.8.8
        "[fe80::1]",
        "[fe80::1%25eth0]",  # with a zone
        "[fec0::1]",
        "[fd00::1]",
        "[fd00:ec2::254]",  # a cloud metadata service's IPv6 address
        "[ff02::1]",
        "[2001:db8::1]",
        "[3fff::1]",
        "[::]",
        "[::1]",
        "169.254.169.254",
        "100.100.100.200",  # a metadata service in shared address space
    ],
)
def test_hostile_forms_are_refused(host):
    assert relays.refusal(f"http://{host}:80/", []) is not None, host


@pytest.mark.parametrize(
    "url", ["http://2130706433/", "http://0x7f.1/", "http://127.1/", "http://0177.0.0.1/"]
)
def test_spellings_of_loopback_are_refused(url):
    """Not IP literals to `ipaddress`: they go to getaddrinfo, which reads them as
    127.0.0.1 without asking DNS."""
    assert relays.resolve(url.split("/")[2]) == {ipaddress.ip_address("127.0.0.1")}
    assert "127.0.0.1 is loopback (127.0.0.0/8)" in relays.refusal(url, [])


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "1.1.1.1",
        "9.9.9.9",
        "2606:4700:4700::1111",
        "2a00:1450:4001::1",
        # just outside the special ranges
        "100.63.255.255",
        "100.128.0.0",
        "172.15.255.255",
        "172.32.0.0",
        "192.0.1.0",
        "192.88.98.255",
        "192.169.0.0",
        "198.17.255.255",
        "198.20.0.0",
        "223.255.255.255",
        "2000::",
        "2001:200::",
        "2001:db7:ffff:ffff:ffff:ffff:ffff:ffff",
        "2001:db9::",
        "2003::",
        "2620:4f:7fff:ffff:ffff:ffff:ffff:ffff",
        "2620:4f:8001::",
        "3ffe:ffff::1",
        "3fff:1000::",
        "3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    ],
)
def test_public_addresses_are_allowed(address):
    assert relays.refusal(_url(address), []) is None, relays.refusal(_url(address), [])
    assert relays.vetted_addresses(_url(address), []) == {ipaddress.ip_address(address)}


@pytest.mark.parametrize(
    "address, networks",
    [
        ("127.0.0.1", ["127.0.0.0/8"]),
        ("127.0.0.1", ["fd00::/8", "127.0.0.1/32"]),
        ("10.1.2.3", ["10.0.0.0/8"]),
        ("169.254.169.254", ["169.254.169.254/32"]),
        ("fd00::1", ["fd00::/8"]),
        ("::1", ["::1/128"]),
        ("::ffff:8.8.8.8", ["::ffff:0:0/96"]),
        ("::ffff:127.0.0.1", ["::ffff:0:0/96", "127.0.0.0/8"]),
        ("2002:7f00:1::1", ["2002::/16", "127.0.0.0/8"]),
    ],
)
def test_addresses_inside_the_operators_networks_are_allowed(address, networks):
    assert relays.refusal(_url(address), networks) is None


@pytest.mark.parametrize(
    "address, networks",
    [
        ("127.0.0.1", ["::/0"]),  # an IPv6 network allows no IPv4 address
        ("::ffff:127.0.0.1", ["0.0.0.0/0"]),  # nor the other way round
        ("10.1.2.3", ["127.0.0.0/8"]),
        ("::ffff:127.0.0.1", ["127.0.0.0/8"]),  # the IPv6 form needs its own range
        ("::ffff:127.0.0.1", ["::ffff:0:0/96"]),  # and the IPv4 address it carries
        ("2002:7f00:1::1", ["2002::/16"]),
        ("64:ff9b::7f00:1", ["64:ff9b::/96"]),
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", ["2001::/32"]),  # Teredo around 127.0.0.1
    ],
)
def test_an_allowance_covers_only_its_own_range(address, networks):
    assert relays.refusal(_url(address), networks) is not None


@pytest.mark.parametrize(
    "url, message",
    [
        ("http://[::127.0.0.1]/", "::7f00:1 is deprecated IPv4-compatible (::/96)"),
        ("http://[::ffff:0:127.0.0.1]/", "::ffff:0:7f00:1 is IPv4-translated (::ffff:0:0:0/96)"),
        ("http://[::ffff:8.8.8.8]/", "::ffff:808:808 is IPv4-mapped (::ffff:0:0/96)"),
        (
            "http://[::ffff:10.0.0.1]/",
            "::ffff:a00:1 carries 10.0.0.1, which is private (10.0.0.0/8)",
        ),
        ("http://[2002:a9fe:a9fe::1]/", "carries 169.254.169.254, which is link-local"),
        ("http://[2002:808:808::1]/", "2002:808:808::1 is 6to4 (2002::/16)"),
        ("http://[2001:0:4136:e378:8000:63bf:f7f7:f7f7]/", "is Teredo (2001::/32)"),
        ("http://[2001:2::1]/", "2001:2::1 is benchmarking (2001:2::/48)"),
        ("http://[2001:100::1]/", "2001:100::1 is IETF protocol assignments (2001::/23)"),
        ("http://[2001:db8::1]/", "2001:db8::1 is documentation (2001:db8::/32)"),
        ("http://[3fff::1]/", "3fff::1 is documentation (3fff::/20)"),
        ("http://[fd00::1]/", "fd00::1 is unique-local (fc00::/7)"),
        ("http://[fe80::1]/", "fe80::1 is link-local (fe80::/10)"),
        ("http://[::1]/", "::1 is loopback (::1/128)"),
        ("http://[::]/", ":: is unspecified (::/128)"),
        ("http://[ff02::1]/", "ff02::1 is multicast (ff00::/8)"),
        ("http://[4000::1]/", "4000::1 is not global unicast (outside 2000::/3)"),
        ("http://[1::1]/", "1::1 is not global unicast (outside 2000::/3)"),
        ("http://0.0.0.0/", "0.0.0.0 is unspecified (0.0.0.0/32)"),
        ("http://0.1.2.3/", "0.1.2.3 is this network (0.0.0.0/8)"),
        ("http://100.64.0.1/", "100.64.0.1 is shared address space (100.64.0.0/10)"),
        ("http://192.168.1.1/", "192.168.1.1 is private (192.168.0.0/16)"),
        ("http://192.88.99.1/", "is deprecated 6to4 relay anycast (192.88.99.0/24)"),
        ("http://198.19.0.1/", "198.19.0.1 is benchmarking (198.18.0.0/15)"),
        ("http://255.255.255.255/", "255.255.255.255 is limited broadcast (255.255.255.255/32)"),
        ("http://250.0.0.1/", "250.0.0.1 is reserved (240.0.0.0/4)"),
    ],
)
def test_the_refusal_names_the_most_specific_range(url, message):
    why = relays.refusal(url, [])
    assert message in (why or ""), why
    assert why.endswith("the operator allows such addresses in orchestrator.relay_networks")


def test_check_answers_403_naming_the_range():
    from swarmrl.orchestrator.service import ApiError

    with pytest.raises(ApiError) as e:
        relays.check("http://[::ffff:0:127.0.0.1]:9000/", [])
    assert e.value.status == 403
    assert "IPv4-translated (::ffff:0:0:0/96)" in e.value.detail
    relays.check("http://[2606:4700:4700::1111]:9000/", [])  # no exception
