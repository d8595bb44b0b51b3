"""DiLoCo against synchronous data parallel, on gloo over loopback.

W ranks (processes, `--sites`, default 4) train the same tiny Llama (configs/diloco.toml's
model, corpus and inner optimizer) from the same initial weights, each on its
own shard, for the same number of steps and tokens:

- data parallel: every step, gradients are averaged with torch.distributed's fp32
  `all_reduce`, then AdamW;
- DiLoCo: H = `--inner-steps` AdamW steps, then swarmrl's outer loop
  (diloco/outer.py: 8-bit pseudo-gradient all-reduce, outer Nesterov SGD).

Membership is static here (a stand-in for torchft's manager that always
commits): the benchmark measures the algorithm and its traffic, not recovery.

Reported (JSON): the held-out loss of each at the end, and their ratio (goal:
DiLoCo within 3%); bytes each rank sent, counted per collective as the data a
bandwidth-optimal algorithm moves (all_reduce: 2(W-1)/W of the tensor; alltoall:
what goes to other ranks; allgather: (W-1) copies of the input), and their
ratio (goal: at least 4·H); the 8-bit all-reduce against gloo's fp32
`all_reduce` on 1M and 16M values (median seconds, same divisor); and compute
utilisation (compute seconds / wall seconds) of both on a simulated link of
1 Gb/s and 100 Mb/s: a wrapper around the process group sleeps bytes/bandwidth
after every collective.

    .venv/bin/python bench/diloco.py [--sites 4] [--inner-steps 50] [--outer-steps 12]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class _Delayed:
    """A Work whose wait() also waits out the simulated link."""

    def __init__(self, work, seconds: float):
        self.work, self.seconds = work, seconds

    def wait(self, timeout=None):
        ok = self.work.wait()
        if self.seconds:
            time.sleep(self.seconds)
        return ok


class CountingLink:
    """Wraps a process group: counts the bytes each collective moves from this rank and,
    with `bytes_per_s`, delays each collective by bytes / bandwidth."""

    def __init__(self, pg, world: int, bytes_per_s: float = 0.0):
        self.pg, self.world, self.bytes_per_s = pg, world, bytes_per_s
        self.sent = 0.0
        self.log: list[tuple[str, float]] = []  # (dtype handed to the transport, bytes)

    def _go(self, dtype, nbytes: float, work):
        self.sent += nbytes
        self.log.append((str(dtype), nbytes))
        return _Delayed(work, nbytes / self.bytes_per_s if self.bytes_per_s else 0.0)

    def allreduce(self, tensors, opts):
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        work = self.pg.allreduce(tensors, opts)
        return self._go(tensors[0].dtype, 2 * (self.world - 1) / self.world * nbytes, work)

    def alltoall_base(self, out, inp, out_splits, in_splits, opts):
        me = self.pg.rank()
        nbytes = sum(n for r, n in enumerate(in_splits) if r != me) * inp.element_size()
        work = self.pg.alltoall_base(out, inp, out_splits, in_splits, opts)
        return self._go(inp.dtype, nbytes, work)

    def allgather(self, outs, inps, opts):
        nbytes = sum(t.numel() * t.element_size() for t in inps) * (self.world - 1)
        return self._go(inps[0].dtype, nbytes, self.pg.allgather(outs, inps, opts))


class StaticManager:
    """torchft Manager's part that OuterLoop uses, for a fixed group that always commits."""

    def __init__(self, link, world: int):
        self._pg, self.world = link, world

    def register_state_dict_fn(self, *args):
        pass

    def start_quorum(self):
        pass

    def num_participants(self):
        return self.world

    def errored(self):
        return None

    def report_error(self, e):
        raise e

    def should_commit(self):
        return True


def _setup(args, rank):
    from swarmrl.apps.pretrain.site import build_site
    from swarmrl.config import load_config
    from swarmrl.config.pretrain import PretrainConfig

    overrides = [f"outer_steps={args.outer_steps}", f"diloco.inner_steps={args.inner_steps}",
                 f"seed={args.seed}", f"sites={args.sites}", *args.overrides]  # fmt: skip
    cfg = load_config(ROOT / "configs" / "diloco.toml", overrides, schema=PretrainConfig)
    return (cfg, *build_site(cfg, rank))


def _inner_step(model, shard, gen, inner, cfg, step: int, link=None) -> float:
    """One step (the site's learning-rate schedule); with `link`, gradients are averaged
    over it first (data parallel). Returns the compute seconds (the all-reduce excluded)."""
    import torch
    from torch.distributed.distributed_c10d import AllreduceOptions, ReduceOp

    from swarmrl.apps.pretrain.site import inner_lr, lm_loss

    for group in inner.param_groups:
        group["lr"] = inner_lr(cfg, step)
    t0 = time.perf_counter()
    loss = lm_loss(model, shard.batch(gen, cfg.corpus.batch))
    loss.backward()
    compute = time.perf_counter() - t0
    if link is not None:
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.view(-1) for g in grads])
        opts = AllreduceOptions()
        opts.reduceOp = ReduceOp.SUM
        link.allreduce([flat], opts).wait()
        flat /= link.world
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
    t1 = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.inner.grad_clip)
    inner.step()
    inner.zero_grad(set_to_none=True)
    return compute + time.perf_counter() - t1


def _train(args, rank, world, pg, method: str, steps: int, bytes_per_s: float = 0.0) -> dict:
    import torch.distributed as dist

    from swarmrl.apps.pretrain.site import eval_loss
    from swarmrl.diloco.outer import OuterLoop

    cfg, model, shard, evals, inner, gen = _setup(args, rank)
    link = CountingLink(pg, world, bytes_per_s)
    outer = None
    if method == "diloco":
        outer = OuterLoop(model, cfg.diloco, StaticManager(link, world))
    dist.barrier()
    t0, compute, quant_error = time.perf_counter(), 0.0, None
    for step in range(1, steps + 1):
        compute += _inner_step(
            model, shard, gen, inner, cfg, step - 1, link if method == "dp" else None
        )
        if outer is not None and step % args.inner_steps == 0:
            if step == steps and not bytes_per_s:  # the last pseudo-gradients, 8-bit vs fp32
                quant_error = _quant_error(pg, outer._pseudo_gradient(), world)
            assert outer.sync(has_delta=True).committed
    dist.barrier()
    wall = time.perf_counter() - t0
    return {"eval_loss": eval_loss(model, evals), "bytes_sent": link.sent, "compute_s": compute,
            "wall_s": wall, "quant_rel_error": quant_error}  # fmt: skip


def _quant_error(pg, delta, world: int) -> dict:
    """Relative L2 and max errors of the 8-bit average against the fp32 average."""
    from swarmrl.diloco.allreduce import allreduce_fp32, allreduce_int8

    q = allreduce_int8(pg, delta, world, world)
    exact = allreduce_fp32(pg, delta, world)
    return {"l2": float((q - exact).norm() / exact.norm()),
            "max_over_absmax": float((q - exact).abs().max() / exact.abs().max())}  # fmt: skip


def _allreduce_speed(pg, world: int, numel: int, repeat: int) -> dict:
    import torch
    import torch.distributed as dist

    from swarmrl.diloco.allreduce import allreduce_fp32, allreduce_int8

    x = torch.randn(numel)
    out = {}
    for name, fn in (("fp32", lambda: allreduce_fp32(pg, x, world)),
                     ("int8", lambda: allreduce_int8(pg, x, world, world))):  # fmt: skip
        times = []
        for _ in range(repeat):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times)
    return out


def rank_main(args) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    rank, world = args.rank, args.sites
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank,
                            world_size=world)  # fmt: skip
    pg = dist.group.WORLD
    steps = args.inner_steps * args.outer_steps
    res = {"dp": _train(args, rank, world, pg, "dp", steps),
           "diloco": _train(args, rank, world, pg, "diloco", steps)}  # fmt: skip
    if args.loss_only:
        Path(args.out, f"rank{rank}.json").write_text(json.dumps(res))
        dist.destroy_process_group()
        return
    res["allreduce"] = {
        str(n): _allreduce_speed(pg, world, n, args.repeat) for n in (1 << 20, 1 << 24)
    }
    link_steps = args.inner_steps * 2
    res["links"] = {
        name: {m: _train(args, rank, world, pg, m, link_steps, bps) for m in ("dp", "diloco")}
        for name, bps in (("1Gb/s", 1e9 / 8), ("100Mb/s", 1e8 / 8))
    }
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(res))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sites", type=int, default=4)
    ap.add_argument("--inner-steps", type=int, default=50)
    ap.add_argument("--outer-steps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--loss-only", action="store_true", help="only the two training runs")
    ap.add_argument("overrides", nargs="*", help="dotted overrides of configs/diloco.toml")
    ap.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank >= 0:
        rank_main(args)
        return
    from bench.benchproc import free_port

    out = tempfile.mkdtemp(prefix="bench-diloco-")
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    t0 = time.time()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                *sys.argv[1:],
                "--rank",
                str(r),
                "--port",
                str(port),
                "--out",
                out,
            ],
            env=env,
        )  # fmt: skip
        for r in range(args.sites)
    ]
    if any(p.wait() != 0 for p in procs):
        sys.exit("a rank failed")
    ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(args.sites)]
    r0 = ranks[0]
    dp, dl = r0["dp"], r0["diloco"]
    per_site = lambda m: max(r[m]["bytes_sent"] for r in ranks)  # noqa: E731

    def util(name: str, m: str) -> float:
        runs = [r["links"][name][m] for r in ranks]
        return round(statistics.mean(x["compute_s"] / x["wall_s"] for x in runs), 3)

    if args.loss_only:
        print(json.dumps({"seed": args.seed, "overrides": args.overrides,
                          "dp": round(dp["eval_loss"], 4), "diloco": round(dl["eval_loss"], 4),
                          "ratio": round(dl["eval_loss"] / dp["eval_loss"], 4)}))  # fmt: skip
        return
    result = {
        "sites": args.sites, "inner_steps": args.inner_steps, "outer_steps": args.outer_steps,
        "steps": args.inner_steps * args.outer_steps, "threads": args.threads, "seed": args.seed,
        "dp_eval_loss": round(dp["eval_loss"], 4), "diloco_eval_loss": round(dl["eval_loss"], 4),
        "diloco_loss_vs_dp": round(dl["eval_loss"] / dp["eval_loss"], 4),
        "dp_bytes_per_site": per_site("dp"), "diloco_bytes_per_site": per_site("diloco"),
        "bytes_ratio": round(per_site("dp") / per_site("diloco"), 1),
        "int8_vs_fp32_pseudo_gradient_error": dl["quant_rel_error"],
        "dp_wall_s": round(dp["wall_s"], 2), "diloco_wall_s": round(dl["wall_s"], 2),
        "allreduce_s": {n: {k: round(v, 5) for k, v in x.items()} for n, x in r0["allreduce"].items()},
        "int8_vs_fp32_allreduce_time": {n: round(x["int8"] / x["fp32"], 3)
                                        for n, x in r0["allreduce"].items()},
        "utilisation": {name: {m: util(name, m) for m in ("dp", "diloco")}
                        for name in ("1Gb/s", "100Mb/s")},
        "seconds": round(time.time() - t0, 1),
    }  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()
