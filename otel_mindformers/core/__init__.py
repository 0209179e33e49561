"""The data every layer shares: `StepRecord` (step_record.py) and what it records
(measurements.py), the training thread's hand-off (`SampledStep`), the run's clocks, the run
parts' lifecycle (run_part.py), the bounded background worker and the shutdown deadline."""
