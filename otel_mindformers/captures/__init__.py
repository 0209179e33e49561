"""Captures: evidence taken when a rule fires or on demand (docs/captures.md).

Live: `controller.CaptureController` (profile at step boundaries, stacks, the batch; rate
limits; span event, log record, counter; `NO_CAPTURES` when off), `profile_session.py`
(MindSpore's profiler for N steps) and `store.py` (capture folders, manifests, the disk bound,
the on-demand request file and its watcher).
Offline (`offline/`): `otel-mindformers capture` (request, list, analyse, plot) and
`report --captures`.
"""
