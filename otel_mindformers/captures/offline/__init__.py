"""The captures feature's command and readers: `otel-mindformers capture` and
`report --captures` (analysis layer: no live module imports these)."""
