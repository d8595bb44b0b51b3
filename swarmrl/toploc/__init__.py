"""TOPLOC proofs (issue 4, in progress).

Done: the proof format and arithmetic (poly.py, proof.py), matching
../shared/TOPLOC.md byte for byte. Not yet: capturing hidden states during
generation, Gumbel-max sampling and its check, the validator; rollout files
still carry an empty `proofs` column.
"""
