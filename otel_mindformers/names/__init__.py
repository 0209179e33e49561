"""Every telemetry name the package emits: metric specs, the training-metric table, span and
attribute names, phase, diagnosis and model-state names. The bottom layer: it imports nothing of
the package outside itself."""
