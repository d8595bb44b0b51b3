"""TOPLOC: proofs of the computation behind every rollout, and their checks.

- poly.py: polynomial arithmetic over GF(65497), vectorised with numpy;
- proof.py: building and checking chunk proofs of final-norm hidden states,
  byte for byte the published format, docs/toploc.md (32 positions per chunk,
  top-128, 258 bytes), for many samples at once;
- sampling.py: seeded Gumbel-max sampling (counter-based noise, the same on
  every device and batch) and the validator's token-by-token check of it,
  with a near-tie tolerance.

Workers build proofs while generating (inference/hf.py); validators
check them after one prefill (validator/checks.py).
"""
