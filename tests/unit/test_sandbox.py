"""The code sandbox on hostile programs: each is contained, the caller gets a
result in bounded time, and the machine (this test process, its files, its
environment, its sockets) is unharmed."""

import os
import socket
import subprocess
import time

import pytest

from swarmrl.tasks.graders.sandbox import Limits, namespaces_available, run_python

NS = namespaces_available()
needs_ns = pytest.mark.skipif(NS is not None, reason=f"no namespace isolation here: {NS}")
BOTH = ["process", pytest.param("namespace", marks=needs_ns)]
FAST = Limits(cpu_s=2, wall_s=6.0, memory_mb=256, processes=32)


def _nobody_processes() -> int:
    r = subprocess.run(["ps", "-u", "65534", "-o", "pid="], capture_output=True, text=True)
    return len(r.stdout.split())


@pytest.mark.parametrize("isolation", BOTH)
def test_honest_program_runs(isolation):
    r = run_python("print(sum(map(int, input().split())))", "2 40\n", FAST, isolation)
    assert r.ok and r.stdout == "42\n"


@pytest.mark.parametrize("isolation", BOTH)
def test_infinite_loop_is_stopped(isolation):
    t = time.monotonic()
    r = run_python("while True:\n    pass", "", Limits(cpu_s=1, wall_s=4.0), isolation)
    assert not r.ok and time.monotonic() - t < 8.0


@pytest.mark.parametrize("isolation", BOTH)
def test_sleeping_program_hits_the_wall_clock(isolation):
    t = time.monotonic()
    r = run_python("import time\ntime.sleep(60)", "", Limits(cpu_s=1, wall_s=1.5), isolation)
    assert r.killed == "timeout" and time.monotonic() - t < 6.0


@pytest.mark.parametrize("isolation", BOTH)
def test_memory_bomb_is_refused(isolation):
    code = "blocks = []\nwhile True:\n    blocks.append(bytearray(50 << 20))"
    r = run_python(code, "", FAST, isolation)
    assert not r.ok and "MemoryError" in r.stderr


@pytest.mark.parametrize("isolation", BOTH)
def test_output_flood_is_cut(isolation):
    r = run_python("while True:\n    print('x' * 1000)", "", FAST, isolation)
    assert r.killed == "output" and len(r.stdout) <= FAST.output_bytes


@pytest.mark.parametrize("isolation", BOTH)
def test_environment_is_clean(isolation, monkeypatch):
    monkeypatch.setenv("SWARMRL_TEST_SECRET", "hunter2-token")
    code = (
        "import os, glob\n"
        "print(sorted(os.environ.items()))\n"
        "for p in glob.glob('/proc/[0-9]*/environ'):\n"
        "    try:\n"
        "        print(open(p, 'rb').read())\n"
        "    except OSError:\n"
        "        pass\n"
    )
    r = run_python(code, "", FAST, isolation)
    assert r.ok
    if isolation == "namespace":
        assert "hunter2-token" not in r.stdout  # not its own, not any process it can see
    else:  # its own environment is clean; /proc of same-user processes is not hidden
        assert "hunter2-token" not in r.stdout.splitlines()[0]


@pytest.mark.parametrize("isolation", BOTH)
def test_socket_is_refused(isolation):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.1)
    port = server.getsockname()[1]
    code = (
        "import socket\n"
        f"s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "s.sendall(b'leak')\n"
        "print('connected')\n"
    )
    try:
        r = run_python(code, "", FAST, isolation)
        with pytest.raises(TimeoutError):
            server.accept()  # nothing reached the listener
    finally:
        server.close()
    assert not r.ok and "connected" not in r.stdout


@needs_ns
def test_fork_bomb_is_contained():
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    before = _nobody_processes()
    t = time.monotonic()
    r = run_python(code, "", Limits(cpu_s=2, wall_s=3.0, processes=32), "namespace")
    assert not r.ok and time.monotonic() - t < 10.0
    deadline = time.monotonic() + 10.0  # the kernel tears the PID namespace down
    while _nobody_processes() > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _nobody_processes() <= before  # every fork died with the namespace
    assert subprocess.run(["true"]).returncode == 0  # the machine still forks


@needs_ns
def test_writes_outside_its_directory_do_not_land(tmp_path):
    os.chmod(tmp_path, 0o777)  # even a world-writable host directory is out of reach
    target = tmp_path / "escaped.txt"
    host_tmp = f"/tmp/swarmrl-escape-{os.getpid()}"
    code = (
        f"for p in [{str(target)!r}, {host_tmp!r}, '/dev/shm/escape', 'here.txt']:\n"
        "    try:\n"
        "        open(p, 'w').write('x')\n"
        "        print('wrote', p)\n"
        "    except OSError as e:\n"
        "        print('refused', p, e.errno)\n"
    )
    r = run_python(code, "", FAST, "namespace")
    assert r.ok
    assert "wrote here.txt" in r.stdout  # its own directory works
    assert not target.exists() and not os.path.exists(host_tmp)
    assert not os.path.exists("/dev/shm/escape")


@needs_ns
def test_shell_and_kill_attempts_are_contained(tmp_path):
    me = os.getpid()
    marker = tmp_path / "shell-was-here"
    code = (
        "import os, signal, subprocess\n"
        f"subprocess.run(['sh', '-c', 'echo pwned > {marker}; kill -9 {me}'])\n"
        "for pid in (os.getppid(), 1, " + str(me) + "):\n"
        "    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError:\n"
        "        pass\n"
        "print('still here')\n"
    )
    r = run_python(code, "", FAST, "namespace")
    assert not marker.exists()  # the shell ran as nobody, in its own mount namespace
    assert os.getpid() == me  # and this process was not killed (we are running this line)
    assert r.exit_code is not None or r.killed == "timeout"


def test_program_cannot_read_its_own_source():
    code = "import os\nprint(__file__, os.path.exists(__file__), os.listdir('.'))"
    r = run_python(code, "", FAST, "process")
    assert r.ok and r.stdout == "main.py False []\n"
