"""The protocol seams: the rollout store and work assignment.

Until the orchestrator lands, a run uses `LocalDirStore` (object-store
semantics over a directory shared by the processes of one machine) and
`LocalAssigner` (assignments derived from the trainer's published status).
"""
