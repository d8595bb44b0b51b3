"""swarmrl's TOPLOC proofs against the published PyPI package `toploc==0.1.6`.

    .venv/bin/python bench/toploc_peer.py [--quick] [--reps N] [--threads N]

The peer gets its own venv (bench/.peers/toploc-venv, made on first use) and runs in a
subprocess. Its 0.1.6 wheel's C++ extensions do not load with the pinned torch 2.13
(undefined symbol at::TensorBase::const_data_ptr<float>), so toploc is built from its
sdist against that torch (--no-build-isolation --no-binary toploc, ~2-4 min on 2 cores).
Peer calls: build_proofs_bytes(rows, decode_batching_size=32, topk=128, skip_prefill=True)
(rows: one (H,) bf16 tensor per generated token) and verify_proofs_bytes(2-D tensor, ...,
skip_prefill=True), its C++ path; the published thresholds (38 / 10 / 8) are applied to
its statistics. States checked: original, jitter (x * (1 + 0.004 N(0,1))), x * 1.5, fresh.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from swarmrl.toploc.proof import (  # noqa: E402
    CHUNK,
    TOPK,
    Thresholds,
    build_proofs,
    check_proofs,
    chunk_sizes,
)

PEERS_DIR = Path(__file__).resolve().parent / ".peers"
PACKAGE = "toploc==0.1.6"
STATES = ("orig", "jitter", "scaled", "fresh")
SHOULD_ACCEPT = {"orig": True, "jitter": True, "scaled": False, "fresh": False}

# Run by the peer venv's python: it only calls the package's public functions.
PEER_WORKER = r"""
import json, sys, time
import numpy as np, torch, toploc
inp, out, reps, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if threads:
    torch.set_num_threads(threads)
data = np.load(inp + "/states.npz")
ours = json.load(open(inp + "/ours.json"))
bf16 = lambda a: torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
res = {"torch": torch.__version__, "toploc": toploc.__version__, "cases": {}}
for name, our_hex in ours.items():
    rows = list(bf16(data[name + "/orig"]))
    build_s = []
    for _ in range(reps):
        t0 = time.perf_counter()
        proofs = toploc.build_proofs_bytes(rows, decode_batching_size=32, topk=128, skip_prefill=True)
        build_s.append(time.perf_counter() - t0)
    r = {"proofs": [p.hex() for p in proofs], "build_s": build_s, "verify": {}, "verify_s": []}
    provers = {"peer": proofs, "ours": [bytes.fromhex(h) for h in our_hex]}
    for state in ("orig", "jitter", "scaled", "fresh"):
        states = bf16(data[name + "/" + state])
        for who, pr in provers.items():
            # inputs that kill the peer's process instead of raising (seen with 0.1.6):
            # a chunk with < topk entries or a proof count != chunk count -> c10::Error in a
            # std::thread -> std::terminate; a null proof (modulus 0) -> SIGFPE in x % m
            sizes = [min(32, len(states) - s) * states.shape[1] for s in range(0, len(states), 32)]
            if len(pr) != len(sizes) or min(sizes) < 128 or any(p[:2] == b"\0\0" for p in pr):
                r["verify"][who + "/" + state] = "not run: would crash the peer process"
                continue
            try:
                for _ in range(reps if (who, state) == ("peer", "orig") else 1):
                    t0 = time.perf_counter()
                    v = toploc.verify_proofs_bytes(states, pr, decode_batching_size=32, topk=128, skip_prefill=True)
                    if (who, state) == ("peer", "orig"):
                        r["verify_s"].append(time.perf_counter() - t0)
                r["verify"][who + "/" + state] = [[x.exp_mismatches, x.mant_err_mean, x.mant_err_median] for x in v]
            except Exception as e:
                r["verify"][who + "/" + state] = "error: " + repr(e)[:200]
    res["cases"][name] = r
json.dump(res, open(out, "w"))
"""


def ensure_peer_venv(venv: Path = PEERS_DIR / "toploc-venv") -> tuple[Path, float | None]:
    """A venv with the pinned torch and toploc 0.1.6 built from source; (python, install s)."""
    py = venv / "bin" / "python"
    probe = [str(py), "-c", "import toploc; assert toploc.__version__ == '0.1.6'"]
    if py.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return py, None
    t0 = time.perf_counter()
    pip = [str(py), "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints.txt")]
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        pip + ["torch", "numpy", "setuptools", "wheel", "ninja"],
        pip + ["--no-build-isolation", "--no-binary", "toploc", "--no-deps", PACKAGE],
        probe,
    ]
    for cmd in steps:
        p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "MAX_JOBS": "2"})
        if p.returncode != 0:
            raise RuntimeError(f"peer install failed at {cmd[-1]}:\n{p.stderr[-3000:]}")
    return py, time.perf_counter() - t0


def to_bf16(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(torch.bfloat16)


def bits(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.int16).numpy().view(np.uint16)


def make_states(kind: str, n: int, h: int, rng: np.random.Generator) -> torch.Tensor:
    x = rng.standard_normal((n, h), dtype=np.float32)
    if kind == "act":  # a few outlier dims, varying per-token scale (post-RMSNorm-like)
        gamma = np.ones(h, np.float32)
        gamma[rng.choice(h, 6, replace=False)] = rng.uniform(10, 40, 6) * rng.choice([-1, 1], 6)
        x = x * gamma * rng.uniform(0.7, 1.3, (n, 1)).astype(np.float32)
    elif kind == "collide":  # big pairs 65497 apart in every chunk: forces m < 65497
        for s in range(0, n, CHUNK):
            flat = x[s : s + CHUNK].reshape(-1)
            if flat.size > 65497:
                j = rng.choice(flat.size - 65497, 40, replace=False)
                flat[j], flat[j + 65497] = rng.uniform(20, 40, 40), -rng.uniform(20, 40, 40)
    elif kind == "ties":  # 5 "massive" dims with the same magnitude in every token
        x[:, rng.choice(h, 5, replace=False)] = 50.0 * rng.choice([-1, 1], (n, 5))
    return to_bf16(x)


def make_cases(quick: bool) -> list[dict]:
    full = 2 if quick else 4  # full chunks per sample, then a short chunk of 7 tokens
    hs = (64, 2048, 5120) if quick else (64, 192, 576, 2048, 5120)
    spec = [("gauss", h, CHUNK * full + 7) for h in hs]
    spec += [("act", h, CHUNK * full + 7) for h in ((5120,) if quick else (2048, 5120))]
    spec += [("collide", 5120, CHUNK * full + 7), ("ties", 2048, CHUNK * full + 7)]
    spec += [("tiny_last_chunk", 64, CHUNK + 1)]
    cases = []
    for i, (kind, h, n) in enumerate(spec):
        rng = np.random.default_rng(1000 + i)
        orig = make_states("gauss" if kind == "tiny_last_chunk" else kind, n, h, rng)
        noise = 1 + 0.004 * rng.standard_normal((n, h), dtype=np.float32)
        states = {
            "orig": orig,
            "jitter": to_bf16(orig.float().numpy() * noise),
            "scaled": to_bf16(orig.float().numpy() * 1.5),
            "fresh": make_states(kind if kind != "tiny_last_chunk" else "gauss", n, h, rng),
        }
        cases.append({"name": f"{kind}_H{h}_n{n}", "H": h, "n": n, "states": states})
    return cases


def split(proofs: bytes, n: int, h: int) -> list[bytes]:
    edges = np.cumsum([0, *chunk_sizes(n, h)])
    return [proofs[a:b] for a, b in zip(edges[:-1], edges[1:], strict=True)]


def raw(proof: bytes) -> tuple[int, np.ndarray]:
    """Modulus and coefficients, without validation (the peer emits modulus 0 on errors)."""
    v = np.frombuffer(proof, ">u2").astype(np.int64)
    return int(v[0]), v[1:]


def explain(ours: bytes, peer: bytes, chunk: torch.Tensor) -> str:
    """Why two proofs of the same chunk differ."""
    if len(ours) != len(peer):
        m, c = raw(peer)
        null = m == 0 and not c.any()
        return f"length {len(ours)} vs {len(peer)}" + (" (peer null proof)" if null else "")
    (m1, c1), (m2, c2) = raw(ours), raw(peer)
    if m2 == 0 and not c2.any():
        return "peer null proof (its build raised and fell back to zeros)"
    if ours == np.frombuffer(peer, "<u2").astype(">u2").tobytes():
        return "byte order (little-endian uint16)"
    if (c1 == c2[::-1]).all():
        return "coefficient order reversed"
    flat = chunk.reshape(-1)
    a = set(flat.float().abs().topk(TOPK).indices.tolist())
    b = set(flat.abs().topk(TOPK).indices.tolist())  # the peer's expression, bf16 abs
    if a != b:
        kth = flat.float().abs().sort(descending=True).values[TOPK - 1].item()
        tie = all(abs(flat[i].float().item()) == kth for i in a ^ b)
        return f"top-k set differs in {len(a ^ b) // 2} entries (boundary tie: {tie})"
    if m1 != m2:
        return f"modulus {m1} vs {m2} on the same top-k set"
    return f"same modulus {m1}, {(c1 != c2).sum()} coefficients differ (unexplained)"


def accepts(stats: list) -> list[bool]:
    t = Thresholds()  # the published ones
    return [
        e <= t.max_exp_mismatches and mu <= t.max_mantissa_mean and md <= t.max_mantissa_median
        for e, mu, md in stats
    ]


def ours_check(proofs: bytes, states: torch.Tensor) -> list | str:
    try:
        checks = check_proofs(proofs, states)
        return [[c.exp_mismatches, c.mantissa_mean, c.mantissa_median] for c in checks]
    except Exception as e:
        return "error: " + repr(e)[:200]


def timed(fn, reps: int) -> tuple[object, list[float]]:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, times


def run(quick: bool, reps: int, threads: int) -> dict:
    py, install_s = ensure_peer_venv()
    if threads:
        torch.set_num_threads(threads)
    cases = make_cases(quick)
    ours: dict[str, dict] = {}
    for c in cases:
        orig = c["states"]["orig"]
        proofs, build_s = timed(lambda orig=orig: build_proofs(orig), reps)
        _, verify_s = timed(lambda o=orig, p=proofs: check_proofs(p, o), reps)
        proofs = split(proofs, c["n"], c["H"])
        ours[c["name"]] = {"proofs": proofs, "build_s": build_s, "verify_s": verify_s}

    with tempfile.TemporaryDirectory(prefix="toploc_peer_") as tmp:
        arrays = {f"{c['name']}/{s}": bits(t) for c in cases for s, t in c["states"].items()}
        np.savez(f"{tmp}/states.npz", **arrays)
        hexes = {k: [p.hex() for p in v["proofs"]] for k, v in ours.items()}
        Path(f"{tmp}/ours.json").write_text(json.dumps(hexes))
        p = subprocess.run(
            [str(py), "-c", PEER_WORKER, tmp, f"{tmp}/peer.json", str(reps), str(threads)],
            capture_output=True,
            text=True,
        )
        if p.returncode != 0:
            raise RuntimeError(f"peer worker failed:\n{p.stderr[-3000:]}")
        peer = json.loads(Path(f"{tmp}/peer.json").read_text())

    results = [compare(c, ours[c["name"]], peer["cases"][c["name"]]) for c in cases]
    summary = {
        "bytes_identical": f"{sum(r['bytes_identical'] for r in results)}/{len(results)} cases",
        "differing_cases": [r["case"] for r in results if not r["bytes_identical"]],
        "cross_verification_as_expected": all(r.pop("as_expected") for r in results),
        "note": "as_expected: orig accepted, scaled/fresh rejected by both verifiers, both provers",
    }
    peer_info = {"package": PACKAGE, "install_s": install_s, "torch": peer["torch"]}
    ours_info = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    ours_info["loadavg_1_5_15"] = os.getloadavg()
    out = {"peer": peer_info, "ours": ours_info, "reps": reps, "summary": summary}
    return out | {"cases": results}


def compare(c: dict, mine: dict, theirs: dict) -> dict:
    states, n_ours = c["states"], len(mine["proofs"])
    peer_proofs = [bytes.fromhex(x) for x in theirs["proofs"]]
    same = mine["proofs"] == peer_proofs
    diffs = {}
    for i in range(max(n_ours, len(peer_proofs))):
        a = mine["proofs"][i] if i < n_ours else b""
        b = peer_proofs[i] if i < len(peer_proofs) else b""
        if a != b:
            chunk = states["orig"][i * CHUNK : (i + 1) * CHUNK]
            diffs[i] = explain(a, b, chunk) if a and b else "missing chunk"
    accept, as_expected = {}, True
    agree = {"exp": 0, "mean": 0, "median": 0, "decision": 0, "of": 0, "examples": []}
    for state in STATES:
        row = accept.setdefault(state, {})
        for prover, proofs in (("ours", mine["proofs"]), ("peer", peer_proofs)):
            ov = ours_check(b"".join(proofs), states[state])
            pv = theirs["verify"][f"{prover}/{state}"]
            for verifier, v in (("ours", ov), ("peer", pv)):
                ok = accepts(v) if isinstance(v, list) else v
                row[f"{verifier}<-{prover}"] = (
                    f"{sum(ok)}/{len(ok)}" if isinstance(ok, list) else ok
                )
                if state != "jitter" and isinstance(ok, list):  # jitter: reported only
                    as_expected &= all(x == SHOULD_ACCEPT[state] for x in ok)
            if not (isinstance(ov, list) and isinstance(pv, list)):
                continue
            for i, (x, y) in enumerate(zip(ov, pv, strict=True)):
                agree["of"] += 1
                eq = [x[j] == y[j] or abs(x[j] - y[j]) < 1e-9 for j in range(3)]
                for key, e in zip(("exp", "mean", "median"), eq, strict=True):
                    agree[key] += e
                agree["decision"] += accepts([x]) == accepts([y])
                if not all(eq) and len(agree["examples"]) < 3:
                    agree["examples"].append(f"{state} {prover} chunk {i}: ours {x} peer {y}")
    return {
        "case": c["name"],
        "chunks": n_ours,
        "moduli": [raw(p)[0] for p in mine["proofs"]],
        "bytes_identical": same,
        "differences": diffs,
        "accepted_chunks (verifier<-prover)": accept,
        "stats_agree (ours vs peer verifier, same proof+state)": agree,
        "build_ms_per_chunk": timing(mine["build_s"], theirs["build_s"], n_ours, len(peer_proofs)),
        "verify_ms_per_chunk": timing(mine["verify_s"], theirs["verify_s"], n_ours, n_ours),
        "as_expected": as_expected,
    }


def timing(ours: list[float], peer: list[float], n_ours: int, n_peer: int) -> dict:
    """Median and min over repetitions, per chunk; ratio = ours/peer of the medians."""
    if not peer:
        return {"ours_median": round(statistics.median(ours) / n_ours * 1e3, 3), "peer": None}
    o, p = (np.array(x) / n * 1e3 for x, n in ((ours, n_ours), (peer, n_peer)))
    out = {"ours_median": np.median(o), "peer_median": np.median(p), "ours_min": o.min()}
    out |= {"peer_min": p.min(), "ratio": np.median(o) / np.median(p)}
    return {k: round(float(v), 3) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer shapes, 3 repetitions")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--threads", type=int, default=0, help="torch threads, both sides (0: default)")
    args = ap.parse_args()
    reps = args.reps or (3 if args.quick else 7)
    print(json.dumps(run(args.quick, reps, args.threads)))


if __name__ == "__main__":
    main()
