"""Where problems come from: generated from the seed (generated.py,
reasoning-gym families in gym.py), task files and `datasets` directories, and
verifiers environments (environments.py); task_source.py picks one from the
config."""
