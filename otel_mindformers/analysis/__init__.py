"""Offline readers: `otel-mindformers report / plot / replay / hang-report` over JSON-lines logs
and diagnosis files. No runtime module imports this package."""
