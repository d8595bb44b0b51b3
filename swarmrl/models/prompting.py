"""Turn a task prompt into token ids, and completions back into text.

Chat models (a tokenizer with a chat template) get the prompt as one user turn
with the generation prompt appended. Models without a template (the tiny
built-in model) get `prompt + "\n"`: that is the format it was warm-started on.
"""

from __future__ import annotations

from swarmrl.tasks.length import budget_instruction


def prompt_text(task_prompt: str, target_length: int = 0) -> str:
    if target_length > 0:
        return f"{task_prompt}\n{budget_instruction(target_length)}"
    return task_prompt


def encode_prompt(tokenizer, text: str) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    return tokenizer(text + "\n", add_special_tokens=False)["input_ids"]


def decode_completion(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


def model_replies(tokenizer, ids: list[int], mask: list[int] | None) -> list[str] | None:
    """The text of each of the model's spans of a trajectory (None: no mask, a
    single-turn completion)."""
    if mask is None:
        return None
    from swarmrl.protocol.rollouts import spans

    return [decode_completion(tokenizer, ids[a:b]) for a, b, model in spans(mask) if model]
