"""The flight recorder's offline readers (the analysis layer: tests/test_import_graph.py)."""
