"""The first NaN/Inf of a job, and the first rank it appeared on.

Live: `first_nonfinite.FirstNonFinite` (`nonfinite_check: all_ranks`: each rank notes its
first non-finite loss or grad norm in its diagnosis file, outputs/diagnosis_file.py).
Offline (`offline/first_bad_rank.py`): the first rank to go bad, from diagnosis files or logs,
for `report` and `hang-report`. See docs/hangs.md.
"""
