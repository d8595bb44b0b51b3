"""The node's client moves objects (rollout files up, files down to validators and the
trainer) on one kept-alive connection, not a client and a connection per file: a
client per file re-read the CA bundle for its TLS context, a fifth of an emulated
worker's CPU (py-spy, bench/swarm_scale.py)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from swarmrl.protocol.client import OrchestratorClient
from swarmrl.protocol.identity import load_or_create_key


class Store(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    peers: list[int] = []
    objects: dict[str, bytes] = {}

    def do_PUT(self):  # noqa: N802 - http.server's naming
        n = int(self.headers["Content-Length"])
        self.objects[self.path] = self.rfile.read(n)
        self.peers.append(self.client_address[1])
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):  # noqa: N802
        body = self.objects.get(self.path, b"")
        self.peers.append(self.client_address[1])
        self.send_response(200 if body else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_objects_move_on_one_kept_alive_connection(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Store)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    client = OrchestratorClient(base, load_or_create_key(tmp_path / "node.key"))
    try:
        for i in range(3):
            client.put_bytes(f"{base}/objects/f{i}", b"file %d" % i)
        assert [client.get_bytes(f"{base}/objects/f{i}", 100) for i in range(3)] == [
            b"file 0",
            b"file 1",
            b"file 2",
        ]
    finally:
        client.close()
        server.shutdown()
    assert len(Store.peers) == 6
    assert len(set(Store.peers)) == 1, f"{len(set(Store.peers))} connections for 6 transfers"
