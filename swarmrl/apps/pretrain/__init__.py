"""The DiLoCo pre-training demo (`swarmrl diloco`): a tiny Llama trained on a
generated corpus (corpus.py) by sites (site.py) that sync through diloco/."""
