"""What two processes must agree on, in one place: identities and request
signing (identity.py, signing.py), the orchestrator client (client.py), the
assignment and rollout-file names (assign.py), seeds (seeds.py), the sampler
state and prompt draw (sampler.py, prompts.py), the rollout file
(rollouts.py), the verdict (verdict.py) and the weights manifest
(manifest.py). An untrusted worker and a trusted validator import the same
code; no producer of a format owns it."""
