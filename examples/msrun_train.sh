#!/usr/bin/env bash
# A 2-rank msrun job, monitored with environment variables alone (docs/distributed.md).
#
#   examples/msrun_train.sh [extra worker args]      e.g. examples/msrun_train.sh --steps 50
#
# Every rank exports to the same OTLP endpoint with its own rank attributes; its run span is
# a child of the span in TRACEPARENT when the launcher (a CI job, a scheduler) sets one.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

export OTEL_SERVICE_NAME="${OTEL_SERVICE_NAME:-msrun-demo}"
export OTEL_EXPORTER_OTLP_ENDPOINT="${OTEL_EXPORTER_OTLP_ENDPOINT:-http://127.0.0.1:4317}"
export OTEL_PYTHON_MINDFORMERS_CONFIG="${OTEL_PYTHON_MINDFORMERS_CONFIG:-$here/msrun_monitor.yaml}"

# opentelemetry-instrument wraps msrun itself: msrun passes its environment (PYTHONPATH
# included) to the workers it starts, so each worker is instrumented too. msrun starts
# workers with the `python` on PATH: it must be the one with otel-mindformers installed.
exec opentelemetry-instrument msrun --worker_num=2 --local_worker_num=2 \
    --master_port="${MASTER_PORT:-8118}" --join=True --log_dir="${MSRUN_LOG_DIR:-./output/msrun_log}" \
    "$here/msrun_worker.py" "$@"
