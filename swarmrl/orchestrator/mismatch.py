"""Per-node mismatch between the log-probs a worker recorded and the trainer's, and
the rule that sends a node whose unchecked files stand out to the validators.

The trainer reports, per step and per (node, checked) pair it trained on, the
mean per-token mismatch KL (a k3 estimate of KL(π_behav ‖ π_prox): π_behav the
policy the worker says sampled each token, π_prox the trainer's at the start of
the step) over `tokens` tokens, and the fraction of those tokens whose weight
was truncated or masked (`POST /v1/trainer/mismatch`). `checked` says whether
the files were validated. The figures are kept in the `mismatch` table, one row
per (step, node, checked); a step posted again (after a resume) replaces its
rows, and rows older than the window are deleted.

The rule, over the window of the last `validator.mismatch_window` steps up to
the step just reported, with token-weighted means (Σ tokens·kl / Σ tokens):

    reference = the larger of the mean KL of every checked file in the
                window (all nodes: validated files are known honest) and
                the (lower) median over nodes of each node's mean KL on all
                its files
    flagged   ⇔ unchecked tokens ≥ mismatch_min_tokens
                and mean KL on unchecked files > mismatch_factor ·
                max(reference, mismatch_floor)

Why the larger of the two: honest mismatch is mostly staleness (the policy
moved between sampling and training), and the few checked files of a window
may all be fresh ones. Measured on the default run (SmolLM2, lr 2e-5): the
checked files of steps 0-3 had KL 5e-9 (trained at the version that sampled
them), the same honest node's unchecked files 0.015 (two versions old), which
the checked reference alone flagged. The median over nodes holds an honest
node to the swarm's typical figure; a forger among honest nodes still stands
out from it. With a single node the median is its own figure, and its forgery
is left to the spot checks; with two, the lower of the two figures.

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
`mismatch_min_tokens` in the window.
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
    """One node's mismatch over the window: tokens and Σ tokens·kl, unchecked and checked."""

    node: str
    unchecked_tokens: int = 0
    unchecked_kl_sum: float = 0.0
    checked_tokens: int = 0
    checked_kl_sum: float = 0.0

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


def reference_kl(window: list[NodeMismatch]) -> float | None:
    """The swarm's mismatch: the larger of the mean KL of every checked file in the
    window and the median over nodes of their mean KL on all files (None: no figures)."""
    per_node = [m.all_kl for m in window if m.all_kl is not None]
    if not per_node:
        return None
    tokens = sum(m.checked_tokens for m in window)
    checked = sum(m.checked_kl_sum for m in window) / tokens if tokens else 0.0
    return max(checked, statistics.median_low(per_node))


def outliers(
    window: list[NodeMismatch], factor: float, floor: float, min_tokens: int
) -> list[NodeMismatch]:
    """The nodes the rule flags (module docstring), in the order of `window`."""
    reference = reference_kl(window)
    if reference is None:
        return []
    limit = factor * max(reference, floor)
    return [
        m
        for m in window
        if m.unchecked_tokens >= min_tokens
        and m.unchecked_kl is not None
        and m.unchecked_kl > limit
    ]


def window_figures(cur, step: int, window: int) -> list[NodeMismatch]:
    """Each node's figures over steps step − window + 1 … step, by node key."""
    rows = cur.execute(
        "SELECT node, checked, SUM(tokens), SUM(tokens * kl) FROM mismatch"
        " WHERE step > ? AND step <= ? GROUP BY node, checked ORDER BY node, checked",
        (step - window, step),
    ).fetchall()
    per: dict[str, dict] = {}
    for node, checked, tokens, kl_sum in rows:
        side = "checked" if checked else "unchecked"
        per.setdefault(node, {})[f"{side}_tokens"] = int(tokens)
        per[node][f"{side}_kl_sum"] = float(kl_sum)
    return [NodeMismatch(node, **f) for node, f in per.items()]


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
                "INSERT INTO mismatch (step, node, checked, tokens, kl, truncated, files)"
                " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (step, node, checked) DO UPDATE SET"
                " tokens = excluded.tokens, kl = excluded.kl,"
                " truncated = excluded.truncated, files = excluded.files",
                (step, node, int(f["checked"]), f["tokens"], max(f["kl"], 0.0), f["truncated"],
                 f["files"]),
            )  # fmt: skip
        cur.execute("DELETE FROM mismatch WHERE step <= ?", (step - v.mismatch_window,))
        svc.set_meta(cur, "mismatch_step", str(step))
        if not rule_active(svc):
            return {"flagged": []}
        window = window_figures(cur, step, v.mismatch_window)
        reference = reference_kl(window)
        first = max(0, step - v.mismatch_window + 1)
        for m in outliers(window, v.mismatch_factor, v.mismatch_floor, v.mismatch_min_tokens):
            detail = (
                f"unchecked mismatch KL {m.unchecked_kl:.4g} over {m.unchecked_tokens} tokens"
                f" > {v.mismatch_factor:g} x max(reference {reference:.4g},"
                f" floor {v.mismatch_floor:g}) in steps {first}..{step}"
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
