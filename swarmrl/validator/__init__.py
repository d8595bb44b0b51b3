"""The validation loop: not built yet (issue 4)."""
