"""The process supervisor: restart policy, the end of a watch, stop_all's grace period."""

from __future__ import annotations

import socket
import sys
import time

from swarmrl.launch.supervisor import Proc, Supervisor, free_port, stop_all, tail


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


class Recorder:
    """A Watcher that records the exits and ends the watch after `rounds` polls."""

    def __init__(self, rounds: int, end_on: str | None = None):
        self.events: list[tuple[str, int, str]] = []
        self.rounds, self.end_on = rounds, end_on

    def exited(self, proc, code, action):
        self.events.append((proc.name, code, action))
        return 7 if action == self.end_on else None

    def round(self, seen):
        self.rounds -= 1
        return 0 if self.rounds <= 0 else None

    def interrupted(self, signum):
        return 130


def test_restart_policy(tmp_path):
    flaky = Proc(
        "flaky",
        py("import sys; sys.exit(2)"),
        tmp_path / "flaky.log",
        max_restarts=2,
        restart_argv=py("import sys; print('again'); sys.exit(2)"),
    )
    done = Proc("done", py("pass"), tmp_path / "done.log")
    refused = Proc("refused", py("import sys; sys.exit(3)"), tmp_path / "r.log", final_codes=(3,))
    procs = [flaky, done, refused]
    for p in procs:
        p.start()
    watcher = Recorder(rounds=40)
    with Supervisor(procs, stop_signals=()) as supervisor:
        assert supervisor.watch(0.05, watcher) == 0
    stop_all(procs, graceful=False, grace_s=1.0)
    flaky_events = [e for e in watcher.events if e[0] == "flaky"]
    assert flaky_events[:3] == [
        ("flaky", 2, "restart"),
        ("flaky", 2, "restart"),
        ("flaky", 2, "give_up"),
    ]
    assert all(e == ("flaky", 2, "give_up") for e in flaky_events[2:])  # at every poll while dead
    assert flaky.restarts == 2 and "again" in tail(flaky.log_path)
    assert not [e for e in watcher.events if e[0] == "done"]  # exit 0: done, left alone
    assert [e for e in watcher.events if e[0] == "refused"] == [("refused", 3, "retire")]
    assert refused.retired and refused.restarts == 0


def test_keep_up_and_ends_run(tmp_path):
    server = Proc("server", py("pass"), tmp_path / "s.log", max_restarts=None, keep_up=True)
    main = Proc("main", py("import time; time.sleep(0.5)"), tmp_path / "m.log", ends_run=True)
    for p in (server, main):
        p.start()
    watcher = Recorder(rounds=10_000, end_on="end")
    with Supervisor([main, server], stop_signals=()) as supervisor:
        assert supervisor.watch(0.05, watcher) == 7
    stop_all([main, server], graceful=False, grace_s=1.0)
    assert watcher.events[-1] == ("main", 0, "end")
    assert server.restarts >= 1 and ("server", 0, "restart") in watcher.events


def test_stop_all_honours_grace_s(tmp_path):
    sleeper = Proc("sleeper", py("import time; time.sleep(60)"), tmp_path / "x.log")
    sleeper.start()
    t0 = time.time()
    stop_all([sleeper], graceful=True, grace_s=0.3)  # waits 0.3 s, not the default 10 s
    assert time.time() - t0 < 5.0
    assert sleeper.poll() is not None


def test_free_port_and_tail(tmp_path):
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    assert tail(tmp_path / "missing.log") == "(no log)"
    (tmp_path / "a.log").write_text("\n".join(str(i) for i in range(20)))
    assert tail(tmp_path / "a.log", 2) == "18\n19"
