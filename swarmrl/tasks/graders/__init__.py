"""How a completion is graded: registry.py maps a task type to its grader
(text tasks there; math.py, code.py with sandbox.py; reasoning-gym and
environment scorers through their sources), and checker.py runs third-party
graders in a child process with a time limit."""
