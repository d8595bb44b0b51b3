"""Multi-turn trajectories with the transformers engine (issue 26, second part).

A trajectory is one completion made of spans: the model writes until its span ends
(end of sequence, or a tool call at the end of its text: `env.ends`), the
environment answers (`env.respond`), and the model goes on from there. Each model
turn is the single-turn loop (`decode`) over the prompt plus every span before it,
with three rules that make the whole trajectory checkable by the single-turn
validator's one prefill:

- **Seeds by position.** A model token's Gumbel noise is keyed by its position in
  the whole completion (environment tokens included), so the validator's
  sampling check runs at the model's positions as it does for one span.
- **Proofs over every position.** The TOPLOC proof covers every completion
  position, environment tokens included: the final-norm state that predicts an
  environment token, or the first token of the next model span, is the one the
  next turn's prefill computes at the last positions of its prompt. The
  validator's prefill over prompt + completion[:-1] has the same states.
- **One length budget.** Model and environment tokens share `max_new_tokens`. A
  trajectory ends at end of sequence, at the budget, when the environment ends it
  (no call, or the turn limit), or when the environment's answer would not fit
  with room for one more token.

An environment with a `turn_role` answers the model's end of turn instead of a
tool call: the model's span ends on its end-of-sequence token, and the
environment's text goes in as the next turn of the model's chat template in
that role (`template_turn`): "user" for a verifiers taskset's own multi-turn
`Env` (envs/verifiers_episodes.py), "tool" for the answer to a call that ended
the turn (`env.tool_turns = "template"`). The trajectory ends when the
environment gives no turn.

`replay` is the validator's side of the same rules: from a file's tokens and
mask it recomputes where each model span had to end and what the environment
had to answer, and names the first place that differs.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarmrl.inference.generation import decode
from swarmrl.inference.hf import final_norm
from swarmrl.protocol.rollouts import spans as mask_spans
from swarmrl.toploc.proof import build_proofs_many
from swarmrl.toploc.sampling import gumbel_sample


@dataclass
class Trajectory:
    tokens: list[int]  # every completion token: the model's spans and the environment's
    logprobs: list[float]  # the model's log-probs; 0.0 at the environment's tokens
    mask: list[int]  # 1: the model wrote the token; 0: the environment did
    finished: bool  # the last model span ended on end of sequence
    proofs: bytes = b""  # TOPLOC proofs of every completion position

    def spans(self) -> list[tuple[int, int, int]]:
        """(mask value, start, end) of each run of model or environment tokens."""
        return [(int(model), a, b) for a, b, model in mask_spans(self.mask)]


SENTINEL = "\x00swarmrl-reply\x00"


def template_turn(tokenizer, content: str, role: str = "user") -> str:
    """The text that follows the model's end-of-turn token when the next turn, in
    `role` ("user" or "tool"), says `content`: from the chat template (what closes
    the assistant's turn after that token, the new turn, the assistant's generation
    prompt), or, for a model without one (the tiny model, prompted `prompt + "\n"`),
    `content` on a line of its own."""
    if not getattr(tokenizer, "chat_template", None):
        return f"\n{content}\n"
    head, tail = _template_turn(tokenizer, role)
    return head + content + tail


def user_turn(tokenizer, content: str) -> str:
    return template_turn(tokenizer, content, "user")


_TEMPLATE_TURNS: dict = {}


def _template_turn(tokenizer, role: str) -> tuple[str, str]:
    """(the template's text between the end-of-turn token and the content of a turn
    in `role`, the text after the content), found by rendering a conversation with one
    more turn."""
    from swarmrl.errors import ConfigError

    key = (tokenizer.name_or_path, str(tokenizer.chat_template), tokenizer.eos_token, role)
    if key not in _TEMPLATE_TURNS:
        mark = "\x00swarmrl-turn\x00"
        talk = [{"role": "user", "content": "q"}, {"role": "assistant", "content": SENTINEL}]
        try:
            a = tokenizer.apply_chat_template(talk, tokenize=False)
            b = tokenizer.apply_chat_template(
                [*talk, {"role": role, "content": mark}], tokenize=False,
                add_generation_prompt=True,
            )  # fmt: skip
        except Exception as e:  # recovered: a template that raises on a role says so
            raise ConfigError(
                f"this model's chat template cannot render a {role} turn: {e}"
            ) from None
        end = a.find(SENTINEL) + len(SENTINEL)
        eos = tokenizer.eos_token or ""
        if not (
            b.startswith(a) and a.count(SENTINEL) == 1 and a.startswith(eos, end)
            and b[len(a):].count(mark) == 1
        ):  # fmt: skip
            raise ConfigError(
                "this model's chat template does not close an assistant turn with its "
                f"end-of-sequence token {eos!r} and append a {role} turn after it; a "
                "multi-turn environment writes its turns that way"
            )
        turn = a[end + len(eos) :] + b[len(a) :]
        head, _, tail = turn.partition(mark)
        _TEMPLATE_TURNS[key] = (head, tail)
    return _TEMPLATE_TURNS[key]


def check_turns(env, tokenizer, eos_id: int) -> None:
    """Refuse at start what would fail at the first environment turn: a chat template
    that cannot render the environment's turns after the model's end of turn, or whose
    end of turn is not the token generation stops on (`eos_id`, the engine's)."""
    from swarmrl.errors import ConfigError

    role = getattr(env, "turn_role", None)
    if not role or not getattr(tokenizer, "chat_template", None):
        return
    stop = tokenizer.convert_tokens_to_ids(tokenizer.eos_token) if tokenizer.eos_token else None
    if stop != eos_id:
        raise ConfigError(
            f"this model's chat template ends a turn with {tokenizer.eos_token!r} (token "
            f"{stop}) but generation stops on token {eos_id}: a multi-turn environment's "
            "turns follow the token the model's span ends on"
        )
    template_turn(tokenizer, "probe", role)


def env_ids(env, tokenizer, answer: str) -> list[int]:
    """The tokens of the environment's span `answer` (a turn of the chat template
    where the environment has a `turn_role`)."""
    role = getattr(env, "turn_role", None)
    if role:
        answer = template_turn(tokenizer, answer, role)
    return tokenizer(answer, add_special_tokens=False)["input_ids"]


def _answer(env, tokenizer, span: list[int], finished: bool, turn: int, room: int):
    """The environment's tokens after the model's span number `turn` (`finished`: it
    ended on end of sequence; `room`: tokens left in the budget after it), or None
    when the trajectory ends there: on end of sequence (unless the environment's
    turns follow it), at the budget, when the environment gives no answer, or when
    its answer would leave no room for one more token."""
    if finished != bool(getattr(env, "turn_role", None)) or room <= 0:
        return None  # end of sequence, a span cut by the budget, or the budget
    answer = env.respond(tokenizer.decode(span, skip_special_tokens=True), turn)
    if answer is None:
        return None
    ids = env_ids(env, tokenizer, answer)
    return ids if len(ids) < room else None


class _TurnStates:
    """The final norm's output: every position of a turn's first forward (the prompt),
    then the last position of each forward after it."""

    def __init__(self, model):
        self.states = []
        self.handle = final_norm(model).register_forward_hook(self._hook)

    def _hook(self, module, inputs, output):
        import torch

        out = output[0] if isinstance(output, tuple) else output
        self.states.append((out if not self.states else out[:, -1]).to(torch.bfloat16))

    def close(self) -> None:
        self.handle.remove()


def generate_trajectories(
    backend, tokenizer, env, prompts: list[list[int]], seeds: list[int],
    max_new_tokens: int, temperature: float, top_p: float, proofs: bool = True,
    greedy: bool = False,
) -> list[Trajectory]:  # fmt: skip
    """One trajectory per prompt, with `backend` (HFBackend) and the environment `env`
    (`ends(span_text) -> bool`, `respond(span_text, turn) -> str | None`), or a list of
    one environment per prompt (envs/environment.py: `bound`). `greedy`: the argmax
    token at every step (held-out evaluation; seeds and temperature unused)."""
    if hasattr(backend, "last_states"):  # the vLLM engine
        if greedy:
            raise ValueError("greedy trajectories are generated with the transformers engine")
        return generate_trajectories_vllm(
            backend, tokenizer, env, prompts, seeds, max_new_tokens, temperature, top_p, proofs
        )
    import torch

    from swarmrl.inference.generation import greedy as argmax

    n = len(prompts)
    envs = env if isinstance(env, list) else [env] * n
    comp: list[list[int]] = [[] for _ in range(n)]
    logps: list[list[float]] = [[] for _ in range(n)]
    mask: list[list[int]] = [[] for _ in range(n)]
    hidden: list[list] = [[] for _ in range(n)]
    pending = [0] * n  # tokens of the environment span the next turn's prefill ends with
    finished = [False] * n
    turn = [0] * n
    active = list(range(n))
    while active:
        rows = active
        offsets = torch.tensor([len(comp[i]) for i in rows], dtype=torch.int64)
        seed_t = torch.tensor([seeds[i] for i in rows], dtype=torch.int64)
        room = [max_new_tokens - len(comp[i]) for i in rows]

        def choose(logits, t: int, offsets=offsets, seed_t=seed_t):
            if greedy:
                return argmax(logits, t)
            at = (offsets + t).to(logits.device)
            return gumbel_sample(logits, seed_t.to(logits.device), at, temperature, top_p)

        def ends(r: int, tokens: list[int], room=room, rows=rows) -> bool:
            if len(tokens) >= room[r]:
                return True  # this row's share of the budget
            return envs[rows[r]].ends(tokenizer.decode(tokens, skip_special_tokens=True))

        states = _TurnStates(backend.model) if proofs else None
        try:
            out = decode(backend.model, [prompts[i] + comp[i] for i in rows], max(room),
                         choose, [backend.eos_id], backend.pad_id, ends)  # fmt: skip
        finally:
            if states is not None:
                states.close()
        active = []
        for r, i in enumerate(rows):
            c = out[r]
            k = len(c.tokens)
            if states is not None:
                first = states.states[0][r]
                steps = [first[-1]] + [states.states[t][r] for t in range(1, k)]
                if pending[i]:
                    hidden[i].append(first[-(pending[i] + 1) : -1])
                hidden[i].append(torch.stack(steps))
            comp[i] += c.tokens
            logps[i] += c.logprobs
            mask[i] += [1] * k
            pending[i] = 0
            finished[i] = c.finished
            ids = _answer(envs[i], tokenizer, c.tokens, c.finished, turn[i],
                          max_new_tokens - len(comp[i]))  # fmt: skip
            if ids is None:
                continue
            comp[i] += ids
            logps[i] += [0.0] * len(ids)
            mask[i] += [0] * len(ids)
            pending[i] = len(ids)
            turn[i] += 1
            active.append(i)
    out = [Trajectory(comp[i], logps[i], mask[i], finished[i]) for i in range(n)]
    if proofs:
        for t, pb in zip(out, build_proofs_many([torch.cat(h) for h in hidden]), strict=True):
            t.proofs = pb
    return out


STATE_BATCH = 256  # environment positions whose states one vLLM call computes


def generate_trajectories_vllm(
    backend, tokenizer, env, prompts: list[list[int]], seeds: list[int],
    max_new_tokens: int, temperature: float, top_p: float, proofs: bool = True,
) -> list[Trajectory]:  # fmt: skip
    """`generate_trajectories` on the vLLM engine (inference/vllm.py), by the same
    rules. Each turn is one `backend.sample` per active trajectory over the prompt
    and the spans so far, with the Gumbel positions starting at the completion's
    length. vLLM cannot stop a sample on the environment's call rule, so a turn
    samples on to end of sequence or its share of the budget and is cut at the
    first token where `env.ends` holds: the tokens up to there are the ones the
    transformers engine would have drawn (each token's noise depends only on its
    position), and the rest are dropped. The states that predict the environment's
    tokens lie inside the next turn's prefill, where vLLM takes no logits; they are
    computed after the last turn with `backend.last_states` over the trajectory's
    prefixes, batched."""
    n = len(prompts)
    envs = env if isinstance(env, list) else [env] * n
    comp: list[list[int]] = [[] for _ in range(n)]
    logps: list[list[float]] = [[] for _ in range(n)]
    mask: list[list[int]] = [[] for _ in range(n)]
    states: list[dict[int, object]] = [{} for _ in range(n)]  # completion position -> state
    finished = [False] * n
    turn = [0] * n
    active = list(range(n))
    while active:
        got = backend.sample(
            [prompts[i] + comp[i] for i in active], [seeds[i] for i in active],
            [max_new_tokens - len(comp[i]) for i in active], [len(comp[i]) for i in active],
            temperature, top_p, proofs,
        )  # fmt: skip
        rows, active = active, []
        for i, t in zip(rows, got, strict=True):
            k = len(t.tokens)
            for j in range(1, k + 1):  # the call rule, as the transformers engine applies it
                if t.tokens[j - 1] == backend.eos_id:
                    break
                if envs[i].ends(tokenizer.decode(t.tokens[:j], skip_special_tokens=True)):
                    k = j
                    break
            start = len(comp[i])
            if proofs:
                for j in range(min(k + 1, len(t.tokens))):  # past a cut: what predicts the
                    states[i][start + j] = t.hidden[j].clone()  # answer's first token
            span = t.tokens[:k]
            comp[i] += span
            logps[i] += t.logprobs[:k]
            mask[i] += [1] * k
            done = k > 0 and span[-1] == backend.eos_id
            finished[i] = done
            ids = _answer(envs[i], tokenizer, span, done, turn[i], max_new_tokens - len(comp[i]))
            if ids is None:
                continue
            comp[i] += ids
            logps[i] += [0.0] * len(ids)
            mask[i] += [0] * len(ids)
            turn[i] += 1
            active.append(i)
    out = [Trajectory(comp[i], logps[i], mask[i], finished[i]) for i in range(n)]
    if proofs:
        import torch

        wanted = [(i, p) for i in range(n) for p in range(len(comp[i])) if p not in states[i]]
        for a in range(0, len(wanted), STATE_BATCH):  # the prefixes of a batch at a time
            part = wanted[a : a + STATE_BATCH]
            got = backend.last_states([prompts[i] + comp[i][:p] for i, p in part])
            for (i, p), h in zip(part, got, strict=True):
                states[i][p] = h
        hidden = [torch.stack([states[i][p] for p in range(len(comp[i]))]) for i in range(n)]
        for t, pb in zip(out, build_proofs_many(hidden), strict=True):
            t.proofs = pb
    return out


def claimed(env, tokenizer, ids: list[int]) -> str:
    """A file's environment span as the environment's answer it claims to be: one of
    the environment's `failure_answers` (no answer: a time limit, a dead process) only
    when its tokens are exactly that answer's, else its text."""
    for answer in getattr(env, "failure_answers", ()):
        if ids == env_ids(env, tokenizer, answer):
            return answer
    return tokenizer.decode(ids, skip_special_tokens=True)


def replay(
    env, tokenizer, tokens: list[int], mask: list[int], eos_id: int, max_new_tokens: int
) -> tuple[str, str] | None:
    """The generation rules above, checked on a trajectory from a file: None when it is
    one `generate_trajectories` could have made, else (the check that fails, why).

    - termination: a model span ends at the first token where the environment
      says a call ends it, or on end of sequence (the trajectory's last token),
      or at the length limit; a span that goes on past a call, or stops short of
      one, fails here;
    - environment: each environment span is exactly the tokens of what the
      environment answers the model span before it (a forged tool result, turns
      dropped or reordered, a tool run with other limits), and the trajectory
      ends only where the environment ends it or the budget does;
    - unverifiable: an environment span differs where the environment itself
      cannot vouch for its answer (`doubt`: a Python program at its time limit,
      or one whose output changes between runs): reported only when nothing
      else in the trajectory fails (the rest is replayed too), and the
      validator raises it only after its other checks: the file is refused, no
      one is blamed.

    The reader (protocol/rollouts.py) has already checked that the mask starts
    and ends with the model's tokens."""

    def text(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    parts = mask_spans(mask)
    turns = bool(getattr(env, "turn_role", None))  # spans end on end of turn
    turn = 0
    pending = None  # the first turn the environment cannot settle: reported if nothing fails
    for k, (a, b, model) in enumerate(parts):
        if not model:
            continue
        span = tokens[a:b]
        last = k == len(parts) - 1
        if eos_id in span[:-1] or (not last and span[-1] == eos_id and not turns):
            return "termination", f"turn {turn}: the trajectory goes on after end of sequence"
        for i in range(1, len(span)):
            if env.ends(text(span[:i])):
                return "termination", (
                    f"turn {turn}: the model's span goes on after a tool call that ends it "
                    f"(completion token {a + i - 1})"
                )
        # what hands the turn to the environment: the model's end of turn, or a call
        called = span[-1] == eos_id if turns else env.ends(text(span))
        if last:
            if (span[-1] == eos_id and not turns) or b >= max_new_tokens:
                return pending
            if not called:
                return "termination", (
                    f"turn {turn}: the trajectory ends neither on end of sequence, nor at the "
                    "length limit, nor at a tool call"
                )
            answer = env.respond(text(span), turn)
            if answer is None:
                return pending  # the environment ends it, or the turn limit
            room = b + len(env_ids(env, tokenizer, answer))
            if room >= max_new_tokens:
                return pending  # the answer would not fit with one more token
            # the worker's answer, which it did not write, may not have fit where this one does
            doubt = getattr(env, "doubt", None)
            why = doubt and doubt(text(span), turn, answer, "")
            if why:
                return pending or ("unverifiable", f"turn {turn}: {why}")
            return "environment", f"turn {turn}: the trajectory stops where the environment answers"
        if not called:
            what = "end of turn" if turns else "tool call"
            return "termination", f"turn {turn}: a model span ends with no {what} to end it"
        answer = env.respond(text(span), turn)
        if answer is None:
            return "environment", (
                f"turn {turn}: the environment ends the trajectory here, and the file goes on"
            )
        ea, eb, _ = parts[k + 1]
        if tokens[ea:eb] != env_ids(env, tokenizer, answer):
            doubt = getattr(env, "doubt", None)
            why = doubt and doubt(text(span), turn, answer, claimed(env, tokenizer, tokens[ea:eb]))
            if not why:
                return "environment", (
                    f"turn {turn}: the environment's span (completion tokens {ea}..{eb - 1}) is "
                    "not what the environment answers"
                )
            pending = pending or ("unverifiable", f"turn {turn}: {why}")
        turn += 1
    return pending
