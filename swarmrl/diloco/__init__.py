"""DiLoCo's mechanism: the outer loop over torchft (outer.py), the 8-bit
all-reduce of pseudo-gradients (allreduce.py, quant.py), asynchronous
checkpoints (checkpoint.py) and the lighthouse process (lighthouse.py).

Two users: the RL trainer's sites (`[trainer.diloco]`, trainer/diloco.py,
started by launch/diloco_rl.py) and the pre-training demo `swarmrl diloco`
(apps/pretrain/, started by launch/diloco.py).
"""
