"""The GRPO trainer: loss, advantages, batch collection, the loop, checkpoints."""
