"""The data every layer shares: `StepRecord` and what it records (recording.py), the run's clocks,
the bounded background worker and the shutdown deadline."""
