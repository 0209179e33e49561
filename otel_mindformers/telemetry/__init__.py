"""OpenTelemetry plumbing: the providers (OTLP, Prometheus, or the process's own), the training
instruments, step-span ids, the in-place OTLP encoders, export-error reporting and the
Python-logging bridge."""
