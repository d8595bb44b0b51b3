"""Run by test_vllm_backend.py in a process of its own (vLLM's CPU worker takes over
the process's thread settings): files and completions made with the vLLM backend.

    python -m tests.unit.vllm_files TMP MODEL OTHER_MODEL

writes TMP/vllm.json: an honest file, a file generated with OTHER_MODEL's weights
swapped in (and claimed as MODEL's), completions of fixed prompts and seeds under
two samplers before and after the swap back, and the swap times.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

PROMPTS = ["abc", "hello", "swarm", "reverse me", "xyzzy", "a", "tokens!", "qwertyuiop"]
SAMPLERS = [(1.0, 1.0), (0.7, 0.9)]


def completions(backend, tokenizer) -> dict:
    from swarmrl.models.prompting import encode_prompt, prompt_text

    prompts = [encode_prompt(tokenizer, prompt_text(p, 0)) for p in PROMPTS for _ in range(4)]
    seeds = list(range(100, 100 + len(prompts)))
    out = {"prompts": prompts, "seeds": seeds}
    for t, p in SAMPLERS:
        got = backend.generate(prompts, seeds, 40, t, p)
        out[f"{t},{p}"] = [[c.tokens, c.logprobs, c.finished] for c in got]
    return out


def one_token_changed():
    """A worker that generates honestly with vLLM, then changes one token in the middle
    of its longest completion (text and reward are scored from the changed tokens)."""
    from swarmrl.sim.cheats import Cheat

    class OneTokenChanged(Cheat):
        def complete(self, cfg, backend, plan, tokenizer=None):
            out = super().complete(cfg, backend, plan, tokenizer)
            c = max(out, key=lambda c: len(c.tokens))
            i = len(c.tokens) // 2
            c.tokens[i] = (c.tokens[i] + 7) % 90 + 3
            return out

    return OneTokenChanged()


def main(tmp: Path, model: Path, other: Path) -> None:
    from bench.rollout_files import Maker, issued, small_run
    from swarmrl.inference.vllm import VLLMBackend

    cfg = small_run(tmp, model)
    backend = VLLMBackend(kv_cache_gb=1, threads=1, max_model_len=256)
    maker = Maker(cfg, tmp, name="vllm-worker", backend=backend)
    report: dict = {}
    key, data = maker.file()
    report["honest"] = [key, base64.b64encode(data).decode(), issued(key)]
    key, data = maker.file(one_token_changed())
    report["one_token"] = [key, base64.b64encode(data).decode(), issued(key)]
    report["before"] = completions(backend, maker.tokenizer)
    backend.load(other)
    report["swap_s"] = [backend.swap_s]
    report["other"] = completions(backend, maker.tokenizer)
    key, data = maker.file()
    report["other_model"] = [key, base64.b64encode(data).decode(), issued(key)]
    backend.load(model)
    report["swap_s"].append(backend.swap_s)
    report["after"] = completions(backend, maker.tokenizer)
    report.update(trajectories(tmp, model, backend, maker.tokenizer))
    (tmp / "vllm.json").write_text(json.dumps(report))


def trajectories(tmp: Path, model: Path, backend, tokenizer) -> dict:
    """A file of trajectories with the test environment `Echo` (bench/trajectory_envs.py:
    it ends a span after three characters, so vLLM samples past the call and the turn is
    cut), and raw trajectories with `Echo` and `Nag` for the comparison with the HF engine."""
    from bench.rollout_files import Maker, issued, small_run
    from bench.trajectory_envs import Echo, Nag
    from swarmrl.envs import environment as environment_module
    from swarmrl.inference.trajectory import generate_trajectories
    from swarmrl.models.prompting import encode_prompt, prompt_text

    cfg = small_run(tmp, model, *TRAJECTORY_RUN)
    environment_module._BUILT[environment_module.built_key(cfg)] = Echo()
    maker = Maker(cfg, tmp, name="vllm-trajectories", backend=backend)
    key, data = maker.file()
    out = {"trajectory_file": [key, base64.b64encode(data).decode(), issued(key)]}
    prompts = [encode_prompt(tokenizer, prompt_text(p, 0)) for p in PROMPTS for _ in range(2)]
    seeds = list(range(300, 300 + len(prompts)))
    out["trajectory_prompts"] = [prompts, seeds]
    for name, env in (("echo", Echo()), ("nag", Nag())):
        made = generate_trajectories(backend, tokenizer, env, prompts, seeds, 40, 1.0, 1.0)
        out[name] = [[t.tokens, t.logprobs, t.mask, t.finished] for t in made]
    return out


TRAJECTORY_RUN = ('env.kind="tools"', "env.max_turns=3")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
