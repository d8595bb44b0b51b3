"""Starting processes on one machine: the local swarm (`swarmrl rl`,
swarm.py), DiLoCo RL sites (diloco_rl.py) and the DiLoCo pre-training demo
(diloco.py) say what to run; supervisor.py starts, restarts and stops it; the
progress line and end-of-run summary (progress.py) and the plot (report.py)."""
