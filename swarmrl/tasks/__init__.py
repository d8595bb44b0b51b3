"""Tasks: the task record (schema.py), where problems come from (sources/),
how answers are graded (graders/), length rewards (length.py) and the
curriculum that picks the difficulty (curriculum.py)."""
