"""Offline analysis of JSON-lines training logs: read, plot, report, replay."""
