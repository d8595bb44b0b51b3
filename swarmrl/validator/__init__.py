"""The validator: re-checks every rollout file before the trainer may use it.

loop.py is the process (`swarmrl validator`): it claims files from the
orchestrator, judges them with the claimed policy version loaded, and sends
signed verdicts; checks.py holds the checks (schema, identity, assignment,
termination, reward, TOPLOC proofs, sampling). The verdict's format is
protocol/verdict.py; the ledger of judged files is the orchestrator's.
"""
