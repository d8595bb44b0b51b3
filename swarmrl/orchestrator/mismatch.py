"""Per-node mismatch between the log-probs a worker recorded and the trainer's, and
the rule that sends a node whose unchecked files stand out to the validators.

The trainer reports, per step and per (node, checked, staleness) cell it trained
on, the mean per-token mismatch KL (a k3 estimate of KL(π_behav ‖ π_prox): π_behav
the policy the worker says sampled each token, π_prox the trainer's at the start of
the step) over `tokens` tokens, and the fraction of those tokens whose weight was
truncated or masked (`POST /v1/trainer/mismatch`). `checked` says whether the files
were validated; `staleness` is the step minus the policy version that sampled them.
The figures are kept in the `mismatch` table, one row per cell; a step posted again
(after a resume) replaces its rows, and rows older than the window are deleted.

The rule compares like with like: honest mismatch is mostly staleness (the policy
moved between sampling and training), so a node's tokens are held to the swarm's
figure at the same staleness. Over the window of the last
`validator.mismatch_window` steps up to the step just reported, with token-weighted
means (Σ tokens·kl / Σ tokens), for each staleness s that at least two nodes have
tokens at:

    reference_s = the larger of the mean KL of every checked file at s (all
                  nodes: validated files are known honest) and the (lower)
                  median over nodes of each node's mean KL on all its files at s
    limit_s     = mismatch_factor · max(reference_s, mismatch_floor)

and a node, over its unchecked tokens U_s at those staleness values:

    flagged ⇔ Σ U_s ≥ mismatch_min_tokens and Σ U_s·kl_s > Σ U_s·limit_s

Measured on the tiny model's swarm (lr 2.5e-4, two honest workers and a forger,
`tests/integration/test_forged_logprobs.py`): honest files at staleness 1 had KL
0 (the trainer had not moved since), at staleness 2 0.0015-0.056 per node and
step, and once a single file 0.38 against its node's mean of 0.026: 15x. A CI run
of 2026-11-26 flagged an honest node under the earlier rule (factor 10, one
reference over all staleness; its figures were not kept): a file like the 0.38
one is enough, and so is a node whose only file is two versions old while the
others' are fresh, which stands against a reference near 0. The forger (log-probs 3 nats low) is at
16: about 600x. The default factor of 50 leaves 3x between it and the worst honest
file measured, and 12x below the forgery.

Staleness that only one node has in the window is not judged: the median of one
node is its own figure (a single node's forgery is left to the spot checks).

A flagged node is *suspect* (table `suspects`): every file it submits is drawn
for validation whatever `validator.sample_rate`, and its files accepted
unchecked that the trainer has not consumed go back to `pending`, so the
trainer waits for a verdict. A suspect stays suspect for the rest of the run:
there is no automatic clearing, since an honest window after a flag proves
nothing about the next unchecked file (a node can forge only when it is not
watched); every file of it being validated is the cost, and a rejection ejects
it as usual. The rule runs only while spot-checking (validators enabled and
`sample_rate` < 1); with every file validated the figures are still kept.

What this catches and what it does not: log-probs forged far off the policy on
unchecked files. A node that forges within `mismatch_factor` of the reference
is not flagged (the trainer's truncation of the weights bounds what such a
forgery can do), nor one with fewer unchecked tokens than
`mismatch_min_tokens` in the window at a staleness another node shares.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass

from swarmrl.orchestrator.nodes import event
from swarmrl.orchestrator.service import Service

log = logging.getLogger("swarmrl.orchestrator")


@dataclass(frozen=True)
class NodeMismatch:
    """One node's mismatch over the window, at one staleness (None: all of them pooled):
    tokens and Σ tokens·kl, unchecked and checked."""

    node: str
    unchecked_tokens: int = 0
    unchecked_kl_sum: float = 0.0
    checked_tokens: int = 0
    checked_kl_sum: float = 0.0
    staleness: int | None = None

    @property
    def unchecked_kl(self) -> float | None:
        return self.unchecked_kl_sum / self.unchecked_tokens if self.unchecked_tokens else None

    @property
    def checked_kl(self) -> float | None:
        return self.checked_kl_sum / self.checked_tokens if self.checked_tokens else None

    @property
    def all_kl(self) -> float | None:
        tokens = self.unchecked_tokens + self.checked_tokens
        return (self.unchecked_kl_sum + self.checked_kl_sum) / tokens if tokens else None


@dataclass(frozen=True)
class Outlier:
    """A flagged node: its judged unchecked tokens, their mean KL, and the mean limit
    they were held to (Σ U_s·limit_s / Σ U_s)."""

    node: str
    tokens: int
    kl: float
    limit: float


def reference_kl(window: list[NodeMismatch]) -> float | None:
    """The swarm's mismatch: the larger of the mean KL of every checked file in the
    window and the median over nodes of their mean KL on all files (None: no figures).
    The rule applies it to the cells of one staleness; the ledger shows it pooled."""
    per_node = [m.all_kl for m in window if m.all_kl is not None]
    if not per_node:
        return None
    tokens = sum(m.checked_tokens for m in window)
    checked = sum(m.checked_kl_sum for m in window) / tokens if tokens else 0.0
    return max(checked, statistics.median_low(per_node))


def staleness_limits(cells: list[NodeMismatch], factor: float, floor: float) -> dict:
    """limit_s for every staleness at least two nodes have figures at (module docstring)."""
    by: dict[int | None, list[NodeMismatch]] = {}
    for m in cells:
        by.setdefault(m.staleness, []).append(m)
    limits = {}
    for s, group in by.items():
        reference = reference_kl(group)
        if reference is not None and len({m.node for m in group if m.all_kl is not None}) >= 2:
            limits[s] = factor * max(reference, floor)
    return limits


def outliers(
    cells: list[NodeMismatch], factor: float, floor: float, min_tokens: int
) -> list[Outlier]:
    """The nodes the rule flags (module docstring), in the order of first appearance.
    `cells`: one per (node, staleness)."""
    limits = staleness_limits(cells, factor, floor)
    judged: dict[str, list[float]] = {}  # node -> [tokens, Σ tokens·kl, Σ tokens·limit]
    for m in cells:
        if m.staleness not in limits or not m.unchecked_tokens:
            continue
        acc = judged.setdefault(m.node, [0, 0.0, 0.0])
        acc[0] += m.unchecked_tokens
        acc[1] += m.unchecked_kl_sum
        acc[2] += m.unchecked_tokens * limits[m.staleness]
    return [
        Outlier(node, int(tokens), kl_sum / tokens, allowed / tokens)
        for node, (tokens, kl_sum, allowed) in judged.items()
        if tokens >= min_tokens and kl_sum > allowed
    ]


def window_figures(cur, step: int, window: int, by_staleness: bool = False) -> list[NodeMismatch]:
    """Each node's figures over steps step − window + 1 … step, by node key: pooled over
    staleness, or one per (node, staleness) with `by_staleness`."""
    rows = cur.execute(
        "SELECT node, staleness, checked, SUM(tokens), SUM(tokens * kl) FROM mismatch"
        " WHERE step > ? AND step <= ? GROUP BY node, staleness, checked"
        " ORDER BY node, staleness, checked",
        (step - window, step),
    ).fetchall()
    per: dict[tuple, dict] = {}
    for node, staleness, checked, tokens, kl_sum in rows:
        f = per.setdefault((node, staleness if by_staleness else None), {})
        side = "checked" if checked else "unchecked"
        f[f"{side}_tokens"] = f.get(f"{side}_tokens", 0) + int(tokens)
        f[f"{side}_kl_sum"] = f.get(f"{side}_kl_sum", 0.0) + float(kl_sum)
    return [NodeMismatch(node, **f, staleness=s) for (node, s), f in per.items()]


def rule_active(svc: Service) -> bool:
    v = svc.cfg.validator
    return v.enabled and v.sample_rate < 1.0


def is_suspect(cur, node: str) -> bool:
    return cur.execute("SELECT 1 FROM suspects WHERE node = ?", (node,)).fetchone() is not None


def recheck_unconsumed(svc: Service, cur, node: str | None = None) -> int:
    """Files of suspect nodes (or of `node`) accepted unchecked and not consumed go
    back to pending validation. Nothing with validators off: no one would judge them."""
    if not svc.cfg.validator.enabled:
        return 0
    sql = (
        "UPDATE files SET state = 'pending', validator = NULL, lease = NULL"
        " WHERE state = 'accepted' AND checked = 0 AND void = 0 AND "
    )
    if node is None:
        return cur.execute(sql + "node IN (SELECT node FROM suspects)").rowcount
    return cur.execute(sql + "node = ?", (node,)).rowcount


def record(svc: Service, step: int, figures: list[dict]) -> dict:
    """Keep the trainer's figures for `step` (unknown nodes ignored), then apply the
    rule; answers the nodes newly flagged."""
    v = svc.cfg.validator
    now = svc.clock()
    flagged = []
    with svc.db.tx() as cur:
        known: dict[str, bool] = {}
        for f in figures:
            node = f["node"]
            if node not in known:
                known[node] = (
                    cur.execute("SELECT 1 FROM nodes WHERE key = ?", (node,)).fetchone() is not None
                )
            if not known[node]:
                continue
            cur.execute(
                "INSERT INTO mismatch (step, node, checked, staleness, tokens, kl, truncated,"
                " files) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (step, node, checked, staleness) DO UPDATE SET"
                " tokens = excluded.tokens, kl = excluded.kl,"
                " truncated = excluded.truncated, files = excluded.files",
                (step, node, int(f["checked"]), f["staleness"], f["tokens"], max(f["kl"], 0.0),
                 f["truncated"], f["files"]),
            )  # fmt: skip
        cur.execute("DELETE FROM mismatch WHERE step <= ?", (step - v.mismatch_window,))
        svc.set_meta(cur, "mismatch_step", str(step))
        if not rule_active(svc):
            return {"flagged": []}
        cells = window_figures(cur, step, v.mismatch_window, by_staleness=True)
        first = max(0, step - v.mismatch_window + 1)
        for m in outliers(cells, v.mismatch_factor, v.mismatch_floor, v.mismatch_min_tokens):
            detail = (
                f"unchecked mismatch KL {m.kl:.4g} over {m.tokens} tokens > {m.limit:.4g},"
                f" {v.mismatch_factor:g} x max(the swarm's at the same staleness,"
                f" floor {v.mismatch_floor:g}), in steps {first}..{step}"
            )
            new = cur.execute(
                "INSERT INTO suspects VALUES (?, ?, ?, ?) ON CONFLICT (node) DO NOTHING"
                " RETURNING node",
                (m.node, now, step, detail),
            ).fetchone()
            if new is None:
                continue
            returned = recheck_unconsumed(svc, cur, m.node)
            event(cur, now, m.node, "suspect", 0.0, f"{detail}; {returned} files sent back")
            log.warning(
                "node %s is suspect: %s; every file of it is now validated (%d accepted"
                " unchecked files sent back to pending)",
                m.node, detail, returned,
            )  # fmt: skip
            flagged.append(m.node)
    return {"flagged": flagged}
