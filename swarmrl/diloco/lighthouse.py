"""The torchft lighthouse as a process of its own (`python -m swarmrl.diloco.lighthouse`),
so its log goes to its own file. It forms quorums from the sites' requests and
heartbeats; it holds no training state (a restarted lighthouse loses nothing but
the current quorum)."""

from __future__ import annotations

import argparse
import signal
import threading


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m swarmrl.diloco.lighthouse")
    ap.add_argument("--bind", required=True, help="host:port to listen on")
    ap.add_argument("--min-sites", type=int, default=1)
    ap.add_argument("--join-timeout-s", type=float, default=120.0)
    ap.add_argument("--heartbeat-timeout-s", type=float, default=5.0)
    args = ap.parse_args()
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(
        bind=args.bind,
        min_replicas=args.min_sites,
        join_timeout_ms=int(args.join_timeout_s * 1000),
        heartbeat_timeout_ms=int(args.heartbeat_timeout_s * 1000),
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.shutdown()


if __name__ == "__main__":
    main()
