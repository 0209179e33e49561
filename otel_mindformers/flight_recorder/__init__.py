"""The flight recorder: what a rank knew survives its death (docs/flight_recorder.md).

`ring.py` (the memory-mapped ring file: its layout, the writer, the reader), `recovery.py`
(a dead run's tail and last finished step, read back by the next attempt or an offline
command), `recorder.py` (the run's own ring, and its predecessors' tails handed on to the
outputs and OTLP).
"""
