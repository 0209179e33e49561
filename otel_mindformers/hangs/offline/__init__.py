"""The hang feature's offline readers: `otel-mindformers hang-report` and the schema of the
diagnosis records it reads (analysis layer: no live module imports these)."""
