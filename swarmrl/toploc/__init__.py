"""TOPLOC proofs: not built yet (issue 4). Rollout files carry an empty `proofs` column."""
