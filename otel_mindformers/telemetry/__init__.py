"""OpenTelemetry plumbing: providers/exporters (providers.py) and instruments (instruments.py)."""
