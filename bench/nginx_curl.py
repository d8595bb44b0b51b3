"""The practical limit for the SHARDCAST benchmark: nginx serving a file to parallel curls.

`run_nginx_curl` installs nginx from Debian's packages if it is missing, starts
its own instance on a free loopback port (its own config, pid and temp files in
the work directory, sendfile on), and times `clients` parallel `curl` downloads,
then the same with verification (sha256sum afterwards, and streamed through
`tee | sha256sum`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from benchproc import (
    MB,
    Proc,
    clean_env,
    free_port,
    process_tree,
    rm_tree,
    sha256_file,
    status_kb,
    wait_port,
    warm_cache,
)


def _ensure_nginx() -> str:
    exe = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if exe:
        return exe
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "install", "-y", "-q", "nginx"], check=True, env=env)
    return shutil.which("nginx") or "/usr/sbin/nginx"


NGINX_CONF = """\
daemon off;
master_process on;
worker_processes auto;
{user}
pid {wd}/nginx.pid;
error_log {wd}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    default_type application/octet-stream;
    client_body_temp_path {wd}/tmp/body;
    proxy_temp_path {wd}/tmp/proxy;
    fastcgi_temp_path {wd}/tmp/fastcgi;
    uwsgi_temp_path {wd}/tmp/uwsgi;
    scgi_temp_path {wd}/tmp/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {wd}/www;
    }}
}}
"""


def run_nginx_curl(src: Path, workdir: Path, clients: int = 8, *, keep: bool = False) -> dict:
    """Serve `src` with our own nginx on 127.0.0.1 to `clients` parallel curl downloads."""
    src = Path(src).resolve()
    wd = Path(workdir).resolve() / "nginx_curl"
    rm_tree(wd)
    (wd / "tmp").mkdir(parents=True)
    (wd / "www").mkdir()
    (wd / "out").mkdir()
    size = src.stat().st_size
    want_sha = sha256_file(src)
    exe = _ensure_nginx()
    version = subprocess.run([exe, "-v"], capture_output=True, text=True).stderr.strip()
    served = wd / "www" / "checkpoint.bin"
    if src.stat().st_dev == wd.stat().st_dev:
        os.link(src, served)
    else:
        served.symlink_to(src)
    port = free_port()
    # As root, nginx workers would otherwise run as nobody and could not read a 0700 workdir.
    user = "user root;" if os.geteuid() == 0 else ""
    conf = wd / "nginx.conf"
    conf.write_text(NGINX_CONF.format(wd=wd, port=port, user=user))
    subprocess.run(
        [exe, "-t", "-q", "-p", str(wd), "-c", str(conf), "-e", str(wd / "error.log")], check=True
    )

    curls: list[subprocess.Popen] = []
    nginx = None
    try:
        nginx = Proc(
            "nginx",
            [exe, "-p", str(wd), "-c", str(conf), "-e", str(wd / "error.log")],
            wd / "nginx.stderr",
            env=clean_env(),
        )
        wait_port(port)
        warm_cache(src)
        url = f"http://127.0.0.1:{port}/checkpoint.bin"
        outs = [wd / "out" / f"client_{i}.bin" for i in range(clients)]
        t0 = time.monotonic()
        curls = [
            subprocess.Popen(
                ["curl", "-s", "-S", "--fail", "-o", str(o), url], start_new_session=True
            )
            for o in outs
        ]
        rcs = [c.wait() for c in curls]
        t1 = time.monotonic()
        sums = [
            subprocess.Popen(["sha256sum", str(o)], stdout=subprocess.PIPE, text=True) for o in outs
        ]
        digests = [s.communicate()[0].split()[0] if s.stdout else "" for s in sums]
        t2 = time.monotonic()
        if any(rcs) or any(d != want_sha for d in digests):
            raise RuntimeError(
                f"nginx/curl failed: curl rcs {rcs}, digests ok {[d == want_sha for d in digests]}"
            )
        # Verified delivery done as well as a shell can: hash while downloading.
        for o in outs:
            o.unlink()
        os.sync()
        t3 = time.monotonic()
        curls = [
            subprocess.Popen(
                ["sh", "-c", f"curl -s -S --fail {url} | tee {o} | sha256sum"],
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            for o in outs
        ]
        streamed = [c.communicate()[0].split()[0] for c in curls]
        t4 = time.monotonic()
        if any(d != want_sha for d in streamed):
            raise RuntimeError("nginx/curl|tee|sha256sum: wrong digest")
        workers = [p for p in process_tree(nginx.p.pid) if p != nginx.p.pid]
        worker_hwm = max((status_kb(p, "VmHWM") or 0 for p in workers), default=0)
        seconds = t1 - t0
        return {
            "system": version.replace("nginx version: ", ""),
            "seconds": round(seconds, 3),
            "seconds_with_verify": round(t2 - t0, 3),
            "verify_seconds": round(t2 - t1, 3),
            "seconds_streamed_verify": round(t4 - t3, 3),
            "throughput_MBps": round(clients * size / seconds / MB, 1),
            "peak_rss_nginx_worker_MB": round(worker_hwm / 1024, 1),
            "nginx_workers": len(workers),
            "bytes": size,
            "clients": clients,
            "notes": [
                "seconds: from starting the curls until all exited (files written to disk); "
                "seconds_with_verify: plus sha256sum of all files, run in parallel; "
                "seconds_streamed_verify: a second round of `curl | tee file | sha256sum`, "
                "hashing while downloading.",
                "nginx: sendfile on, tcp_nopush on, access_log off, worker_processes auto.",
            ],
        }
    finally:
        for c in curls:
            if c.poll() is None:
                os.killpg(c.pid, signal.SIGKILL)
                c.wait()
        if nginx is not None:
            nginx.kill(signal.SIGQUIT)  # graceful stop of our master; group killed after
        if not keep:
            rm_tree(wd / "out")
