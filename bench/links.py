"""What a packet sees on the emulated network's links (sim/netns.py, sim/delayline.py):
for each link the swarm bench uses, the round trip, jitter and loss set against those
measured, ping-style (UDP echoes, one at a time, then a burst for the loss) and by a
TCP transfer (its throughput against the link's rate, and the connect time: one round
trip).

A client node on the link under test talks to a server node on a clean 1 Gbit/s link
with SERVER_RTT_MS of round trip (the swarm's servers); the round trip expected is
the sum of the two links', the loss that of the client's link crossed twice. Needs
root, network namespaces and NetfilterQueue (make netqueue); where they are missing
it says why and exits 2.

    .venv/bin/python bench/links.py [--pings 200] [--burst 4000] [--mb 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swarmrl.sim import netns  # noqa: E402

SERVER_RTT_MS = 10.0
# (Mbit/s, round trip ms, jitter ms, loss each way): the swarm bench's extremes and middle
LINKS = [(100, 20, 2, 0.0), (50, 120, 12, 0.005), (10, 300, 30, 0.01), (10, 300, 30, 0.0)]

SERVER = textwrap.dedent("""
    import socket, sys, threading
    host = sys.argv[1]
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.setsockopt(socket.SOL_SOCKET, 33, 1 << 23)  # SO_RCVBUFFORCE
    u.bind((host, 9000))
    t = socket.socket()
    t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    t.bind((host, 9001))
    t.listen()
    def sink():
        while True:
            c, _ = t.accept()
            while c.recv(1 << 20):
                pass
            c.sendall(b"k")
            c.close()
    threading.Thread(target=sink, daemon=True).start()
    while True:
        data, peer = u.recvfrom(2048)
        u.sendto(data, peer)
""")

CLIENT = textwrap.dedent("""
    import json, socket, sys, time
    host, pings, burst, mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.setsockopt(socket.SOL_SOCKET, 33, 1 << 23)
    u.settimeout(2.0)
    rtts = []
    for i in range(pings):
        t0 = time.monotonic()
        u.sendto(i.to_bytes(4, "big") + b"p" * 60, (host, 9000))
        try:
            while int.from_bytes(u.recvfrom(2048)[0][:4], "big") != i:
                pass
            rtts.append((time.monotonic() - t0) * 1000.0)
        except socket.timeout:
            pass
    got = set()
    for i in range(10**6, 10**6 + burst):
        u.sendto(i.to_bytes(4, "big") + b"b" * 60, (host, 9000))
        time.sleep(0.0005)
    u.settimeout(2.0)
    try:
        while True:
            got.add(int.from_bytes(u.recvfrom(2048)[0][:4], "big"))
    except socket.timeout:
        pass
    t0 = time.monotonic()
    s = socket.create_connection((host, 9001))
    connect = (time.monotonic() - t0) * 1000.0
    block, total, sent = b"x" * 65536, int(mb * 1e6), 0
    t0 = time.monotonic()
    while sent < total:
        s.sendall(block)
        sent += len(block)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
    seconds = time.monotonic() - t0
    print(json.dumps({"rtts": rtts, "echoed": len([g for g in got if g >= 10**6]),
                      "connect_ms": connect, "tcp_mbit": sent * 8 / seconds / 1e6}))
""")


def measure(link: tuple, a: argparse.Namespace) -> dict:
    mbit, rtt, jitter, loss = link
    with netns.Network("links") as net:
        server = net.add("server", netns.Link(1000, rtt_ms=SERVER_RTT_MS))
        client = net.add("client", netns.Link(mbit, rtt_ms=rtt, jitter_ms=jitter, loss=loss))
        net.start(server, [sys.executable, "-c", SERVER, server.address])
        time.sleep(0.5)
        args = [server.address, str(a.pings), str(a.burst), str(a.mb)]
        out = net.run(client, [sys.executable, "-c", CLIENT, *args], capture_output=True,
                      text=True, timeout=600)  # fmt: skip
        got = json.loads(out.stdout)
    rtts = sorted(got["rtts"])
    lost_pings = a.pings - len(rtts)
    return {
        "set": {
            "mbit": mbit,
            "rtt_ms": rtt + SERVER_RTT_MS,
            "jitter_ms": jitter,
            "loss": loss,
            "echo_loss": round(1 - (1 - loss) ** 2, 5),
        },  # fmt: skip
        "measured": {
            "rtt_p50_ms": round(statistics.median(rtts), 1),
            "rtt_p01_ms": round(rtts[int(0.01 * (len(rtts) - 1))], 1),
            "rtt_p99_ms": round(rtts[int(0.99 * (len(rtts) - 1))], 1),
            "rtt_sd_ms": round(statistics.pstdev(rtts), 1),
            "echo_loss": round(1 - got["echoed"] / a.burst, 5),
            "ping_loss": round(lost_pings / a.pings, 4),
            "connect_ms": round(got["connect_ms"], 1),
            "tcp_mbit": round(got["tcp_mbit"], 2),
        },
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pings", type=int, default=200)
    p.add_argument("--burst", type=int, default=4000)
    p.add_argument("--mb", type=float, default=8.0, help="MB sent over TCP per link")
    a = p.parse_args()
    ok, why = netns.available()
    if not ok:
        print(json.dumps({"skipped": why}))
        return 2
    try:
        results = [measure(link, a) for link in LINKS]
    except netns.NetworkUnavailable as e:
        print(json.dumps({"skipped": str(e)}))
        return 2
    for r in results:
        print(json.dumps(r))
    summary = {
        f"{r['set']['mbit']}Mbit_{r['set']['rtt_ms']:g}ms_loss{r['set']['loss']:g}": {
            "rtt_p50_over_set": round(r["measured"]["rtt_p50_ms"] / r["set"]["rtt_ms"], 3),
            "echo_loss_measured": r["measured"]["echo_loss"],
            "echo_loss_set": r["set"]["echo_loss"],
            "tcp_over_rate": round(r["measured"]["tcp_mbit"] / r["set"]["mbit"], 3),
        }
        for r in results
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
