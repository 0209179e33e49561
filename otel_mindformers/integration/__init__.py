"""How the package plugs into the world without code changes: the instrumentor and distro for
`opentelemetry-instrument`, the MindFormers glue and its patches, checkpoint-load phases,
trace-context propagation and the resource detector."""
