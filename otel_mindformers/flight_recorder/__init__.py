"""The flight recorder: what a rank knew survives its death (docs/flight_recorder.md).

`shm.py` (System V shared memory through the C library), `ring.py` (the ring: stores into a
shared-memory segment, copied into a file beside the JSON log; its layout, the writer, the
reader), `recovery.py` (a dead run's tail and last finished step, read back by the next
attempt or an offline command), `recorder.py` (the run's own ring, and its predecessors'
tails handed on to the outputs and OTLP).
"""
