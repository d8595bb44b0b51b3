"""Starting processes on one machine: the local swarm (`swarmrl rl`,
swarm.py), DiLoCo RL sites (diloco_rl.py) and the DiLoCo pre-training demo
(diloco.py), the progress line and end-of-run summary (progress.py) and the
plot (report.py)."""
