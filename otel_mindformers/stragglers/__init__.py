"""Stragglers: which rank holds the job back, and in which section of its time (docs/stragglers.md).

Live: `sections.py` (a sampled window's wall time by section: data_wait, in_step, checkpoint,
evaluation, other) and `rank_signal.RankSections` (the section series and the rank's own
straggler signal, on the pipeline worker).
Offline (`offline/verdict.py`): `report`'s verdict: the bottleneck rank and section.
"""
