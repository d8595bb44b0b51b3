"""Environments of multi-turn trajectories and the tools they offer (issue 26, first part)."""
