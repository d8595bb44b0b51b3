"""Tasks: the task record, generated datasets, verifiers and length rewards."""
