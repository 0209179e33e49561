"""Restarts: a job as a sequence of attempts, and what each restart cost (docs/restarts.md).

Live: `ledger_file.py` (the per-rank ledger file: atomic replace under flock),
`attempt_tracker.AttemptTracker` (this run's entry in the ledger, kept by a heartbeat
thread), `run_attempt.py` (the run's part: resource attributes, the link to the previous
attempt, the job gauges, checkpoint events, the end and the no-progress alert) and
`goodput.py` (the pure timeline of a job's attempts: lost steps, downtime, goodput).
Offline (`offline/`): `report`'s job section and `plot --attempts`.
"""
