"""What summing check 9's token-choice counts over a node's files would catch: a
projection from each judged file's recorded counts, for bench/verification_report.py
(docs/verification.md, "Summing over a node's files")."""

from __future__ import annotations

from swarmrl.config.validator import ValidatorConfig
from swarmrl.validator.version_check import sign_test_p

NODE_WINDOW = 16  # files a node's token-choice counts would be summed over


def node_draws(cheats: list[dict], alpha: float | None = None, window: int = NODE_WINDOW) -> dict:
    """What summing check 9's token-choice counts over a node's files would catch: a
    projection from the recorded counts of each file (version one back), not a check
    the validator runs. Each behaviour's files, in the order they were made, stand for
    one node that behaves so every time; the node is caught by the first file that its
    own checks reject, or whose sign test over the counts of the node's last `window`
    files (since it was last caught) is under `alpha`. Then a fresh node starts. Per
    behaviour: files, nodes caught, files each needed (median / max), and files left
    uncaught at the end; for the honest control, every node caught is a false one. The
    sum is tested again at every file, so an honest node's chance of a false catch
    grows with its files: a built check would need its honest rate per file measured,
    as the per-file test's is. `alpha`: the validator's default sign-test level."""
    alpha = ValidatorConfig().version_draws_alpha if alpha is None else alpha

    out: dict = {}
    for r in sorted(cheats, key=lambda r: r.get("at", 0)):
        name = r["behaviour"] if r["dtype"] == "bfloat16" else f"{r['behaviour']} ({r['dtype']})"
        n = out.setdefault(r["model"], {}).setdefault(
            name, {"files": 0, "nodes_caught": 0, "by_sum": 0, "needed": [], "open": []}
        )
        n["files"] += 1
        s = r.get("stats", {})
        n["open"].append((s.get("version_draws_older_1", 0), s.get("version_draws_claimed_1", 0)))
        recent = n["open"][-window:]
        b, c = sum(x for x, _ in recent), sum(y for _, y in recent)
        summed = sign_test_p(b, c) < alpha
        if r["caught"] or summed:
            n["nodes_caught"] += 1
            n["by_sum"] += summed and not r["caught"]
            n["needed"].append(len(n["open"]))
            n["open"] = []
    for per in out.values():
        for n in per.values():
            need = sorted(n.pop("needed"))
            n["files_to_catch"] = (
                {"median": need[len(need) // 2], "max": need[-1]} if need else None
            )
            n["uncaught_at_end"] = len(n.pop("open"))
    return {"window": window, "alpha": alpha, "models": out}
