"""Can RL teach SmolLM2-135M-Instruct to use the calculator? Its starting point on the
tool demo's task (issue 26), measured before any multi-turn machinery trains it.

On held-out `multiplication` problems (digits = 2: 2-digit times 3-digit), three
ways, each as a completion of the model's chat prompt:
- in its head, greedy, with the default run's instruction ("Answer with the number
  only."): exact accuracy, the baseline the tool must beat;
- with the tool described in the prompt, sampled at temperature 1 (as RL samples):
  the fraction of completions that end their first span with a well-formed
  `<calc>...</calc>` call (the rate RL needs to be well above zero to find the
  tool), the fraction whose call evaluates to the product, and the exact accuracy
  when the calculator's result is given back and the model goes on (one tool turn);
- the same, greedy.

The generation here is transformers' own `generate` with a stop on the closing tag
(text, not tokens), not swarmrl's seeded decoding: a measurement of the starting
point, not of the trajectory machinery. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# `--syntax equals`: no tag to learn: a span that ends with an arithmetic expression and
# "=" is a call, and the calculator writes the value after it (as a person's calculator
# finishes "47 * 382 ="); the prompt is the bare question, which SmolLM2 answers in that
# form by itself
EQUALS = re.compile(r"(\d[\d ()]*(?:[-+*/×x][\d ()]+)+)=\s*\Z")
TOOL_PROMPT = (
    "{q}\nYou have a calculator. To use it, write <calc>expression</calc>, for example "
    "<calc>12 * 345</calc>, and its result will follow. Then write the final answer "
    "as a number."
)


def main() -> None:
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    from swarmrl.config import TaskConfig
    from swarmrl.envs.tools import calculator, call_at_end, result_text
    from swarmrl.models.loading import load_model, load_tokenizer
    from swarmrl.models.prompting import encode_prompt
    from swarmrl.tasks.graders.registry import verify
    from swarmrl.tasks.sources.generated import multiplication

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64, help="held-out problems")
    ap.add_argument("--samples", type=int, default=4, help="sampled completions per problem")
    ap.add_argument("--digits", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--syntax", choices=["tag", "equals"], default="tag")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tok = load_tokenizer("smollm2")
    model = load_model("smollm2").eval()
    cfg = TaskConfig(name="multiplication", digits=args.digits)
    tasks = [multiplication(cfg, "eval", i, args.seed) for i in range(args.n)]

    class CallEnds(StoppingCriteria):
        def __init__(self, start: int):
            self.start = start

        def __call__(self, ids, scores, **kw):
            text = tok.decode(ids[0, self.start :], skip_special_tokens=True)
            return find_call(text) is not None

    def find_call(text: str) -> str | None:
        if args.syntax == "tag":
            call = call_at_end(text)
            return None if call is None else call.argument
        m = EQUALS.search(text)
        return None if m is None else m.group(1).replace("x", "*")

    def gen(prompt_ids: list[int], sample: bool, max_new: int = 48, stop: bool = True) -> str:
        ids = torch.tensor([prompt_ids])
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
            do_sample=sample, temperature=1.0 if sample else None, top_p=1.0 if sample else None,
            top_k=0 if sample else None, pad_token_id=tok.eos_token_id,
            stopping_criteria=StoppingCriteriaList([CallEnds(len(prompt_ids))]) if stop else None,
        )  # fmt: skip
        return tok.decode(out[0, len(prompt_ids) :], skip_special_tokens=True)

    def with_tool(task, sample: bool) -> dict:
        prompt = TOOL_PROMPT.format(q=task.prompt) if args.syntax == "tag" else task.prompt
        ids = encode_prompt(tok, prompt)
        first = gen(ids, sample)
        call = find_call(first)
        row = {"call": call is not None, "right_call": False, "exact": 0.0}
        if call is None:
            row["exact"] = verify(task, first)
            return row
        value = calculator(call)
        row["right_call"] = value == task.verification_info["answer"]
        back = "\n" + result_text(value) if args.syntax == "tag" else f" {value}"
        cont_ids = ids + tok(first + back, add_special_tokens=False)["input_ids"]
        second = gen(cont_ids, sample, max_new=24, stop=False)
        row["exact"] = verify(task, first + back + second)  # the whole trajectory's text
        return row

    t0 = time.time()
    head = [
        verify(t, gen(encode_prompt(tok, f"{t.prompt}\nAnswer with the number only."), False,
                      max_new=16, stop=False))
        for t in tasks
    ]  # fmt: skip
    greedy = [with_tool(t, False) for t in tasks]
    sampled = [with_tool(t, True) for t in tasks for _ in range(args.samples)]

    def rates(rows: list[dict]) -> dict:
        n = len(rows)
        return {
            "n": n,
            "well_formed_call": sum(r["call"] for r in rows) / n,
            "call_gives_the_product": sum(r["right_call"] for r in rows) / n,
            "exact_after_one_tool_turn": sum(r["exact"] for r in rows) / n,
        }

    print(json.dumps({
        "bench": "tool_base_rate",
        "model": "SmolLM2-135M-Instruct (GGUF, float32)",
        "task": f"multiplication, digits={args.digits} (2-digit x 3-digit at 2)",
        "seed": args.seed, "threads": args.threads, "syntax": args.syntax,
        "in_its_head_greedy_exact": sum(head) / len(head),
        "with_tool_greedy": rates(greedy),
        "with_tool_sampled_t1": rates(sampled),
        "seconds": round(time.time() - t0, 1),
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
