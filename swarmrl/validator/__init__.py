"""The validator: re-checks every rollout file before the trainer may use it.

loop.py is the process (`swarmrl validator`): it lists files without a
verdict, judges them, and writes signed verdicts; checks.py holds the checks
(schema, identity, assignment, termination, reward, TOPLOC proofs,
sampling); record.py the signed `Verdict` and the SQLite ledger of judged
files that catches replays.
"""
