"""The query examples of docs/collector.md ("Queries that work") work.

PromQL runs against a real Prometheus scraping a real training's `prometheus` output. No
Tempo, Jaeger or Loki binary exists here, so TraceQL, the Jaeger search and LogQL are
parsed, and every span name, attribute and label they use is checked against what the
package emits (the way test_collector_consistency.py checks the rules); the tail-sampling
policy is checked to keep the spans the trace queries select.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse

import pytest
import yaml

from otel_mindformers.names import phase_names, semconv
from otel_mindformers.names import training as tm
from otel_mindformers.names.phase_names import (
    ATTR_CHECKPOINT_PATH,
    ATTR_CHECKPOINT_SIZE,
    PHASE_CHECKPOINT_LOAD,
    PHASE_COMPILE,
    PHASE_STARTUP,
    SPAN_PREFIX,
)
from tests.support import prometheus as prom
from tests.support import trainer_process
from tests.support.paths import REPO
from tests.support.prometheus_names import emitted_series_names, package_labels, sanitize
from tests.support.promql import labels_used, selectors

DOC = (REPO / "docs" / "collector.md").read_text()
SECTION = DOC[DOC.index("## Queries that work") : DOC.index("\n## ", DOC.index("## Queries that work") + 1)]


def blocks(language: str) -> list[str]:
    return [b.strip() for b in re.findall(rf"```{language}\n(.*?)```", SECTION, re.S)]


# --- what the package emits ------------------------------------------------------------------
PHASES = (
    PHASE_STARTUP,
    PHASE_COMPILE,
    phase_names.PHASE_DATA_WAIT,
    phase_names.PHASE_EVALUATION,
    phase_names.PHASE_CHECKPOINT_SAVE,
    PHASE_CHECKPOINT_LOAD,
)
SPAN_NAMES = {semconv.SPAN_RUN, semconv.SPAN_EPOCH, semconv.SPAN_STEP} | {SPAN_PREFIX + p for p in PHASES}
IDENTITY = {value for key, value in vars(semconv).items() if key.startswith("ATTR_")}
RESOURCE_ATTRIBUTES = IDENTITY | {"service.name", "service.instance.id", "host.name"}
SPAN_ATTRIBUTES = (
    IDENTITY
    | {row.span_attribute for row in tm.TABLE if row.span_attribute}
    | {phase_names.ATTR_PHASE, ATTR_CHECKPOINT_PATH, ATTR_CHECKPOINT_SIZE}
)
# What the logs bridge puts on a record (logs.py), as Loki names structured metadata.
LOG_FIELDS = {
    sanitize(a)
    for a in (
        semconv.ATTR_RANK,
        semconv.ATTR_STEP,
        phase_names.ATTR_PHASE,
        semconv.ATTR_LOGS_DROPPED,
        "code.file.path",
        "code.function.name",
        "code.line.number",
        "thread.name",
    )
}
LOKI_OWN = {"service_name", "trace_id", "span_id", "severity_text"}


def test_the_section_has_each_kind_of_query():
    assert len(blocks("traceql")) >= 3 and blocks("jaeger") and len(blocks("promql")) >= 2 and len(blocks("logql")) >= 2


# --- TraceQL ----------------------------------------------------------------------------------
_VALUE = r'(?:"[^"]*"|-?\d+(?:\.\d+)?(?:ns|us|ms|s|m|h)?|client|server|internal|producer|consumer|error|ok|unset)'
_FIELD = r"(?:name|duration|kind|status|(?:span|resource)\.[A-Za-z_][\w.]*)"
_CONDITION = re.compile(rf"^\s*{_FIELD}\s*(?:=|!=|>=|<=|>|<|=~|!~)\s*{_VALUE}\s*$")
_SPANSET = re.compile(r"\{([^{}]*)\}")


def spansets(query: str) -> list[str]:
    return _SPANSET.findall(query)


@pytest.mark.parametrize("query", blocks("traceql"))
def test_traceql_parses(query):
    assert query.count("{") == query.count("}") and spansets(query)
    for spanset in spansets(query):
        for condition in re.split(r"&&|\|\|", spanset):
            assert _CONDITION.match(condition), f"not a TraceQL condition: {condition!r}"
    between = _SPANSET.sub("S", query)
    assert re.fullmatch(r"S(\s*(>>|>|~|&&|\|\|)\s*S)*(\s*\|\s*select\([^()]*\))?", between), between


@pytest.mark.parametrize("query", blocks("traceql"))
def test_traceql_uses_names_the_package_emits(query):
    for name in re.findall(r'\bname\s*=\s*"([^"]+)"', query):
        assert name in SPAN_NAMES, name
    for scope, attribute in re.findall(r"\b(span|resource)\.([A-Za-z_][\w.]*)", query):
        known = SPAN_ATTRIBUTES if scope == "span" else RESOURCE_ATTRIBUTES
        assert attribute in known, f"{scope}.{attribute} is not an attribute the package sets"


# --- Jaeger -----------------------------------------------------------------------------------
@pytest.mark.parametrize("search", blocks("jaeger"))
def test_jaeger_search_uses_the_packages_span_name_and_tags(search):
    url = urllib.parse.urlsplit(search)
    assert url.path == "/api/traces"
    params = dict(urllib.parse.parse_qsl(url.query))
    assert params["operation"] in SPAN_NAMES
    tags = json.loads(params["tags"])
    # `error` is Jaeger's own tag for an OTLP error status (non-finite values, alerts).
    assert set(tags) - {"error"} <= SPAN_ATTRIBUTES | RESOURCE_ATTRIBUTES
    assert all(isinstance(value, str) for value in tags.values())  # Jaeger compares tag strings


# --- LogQL ------------------------------------------------------------------------------------
@pytest.mark.parametrize("query", blocks("logql"))
def test_logql_uses_the_labels_and_fields_log_records_carry(query):
    stream, _, pipeline = query.partition("}")
    assert stream.startswith("{") and re.fullmatch(r'\{\s*service_name="[^"]+"\s*', stream)
    stages = [s.strip() for s in pipeline.split("|") if s.strip()]
    assert stages
    for stage in stages:
        match = re.fullmatch(r'([a-z_]+)\s*(=|!=|>=|<=|>|<|=~)\s*("[^"]*"|\d+)', stage)
        assert match, f"not a label filter: {stage!r}"
        assert match.group(1) in LOG_FIELDS | LOKI_OWN, match.group(1)


# --- tail sampling ------------------------------------------------------------------------------
def _kept_by_policy(span_name: str) -> bool:
    """What the `ottl_condition` span policies of otelcol.yaml say about a span of that name:
    a condition is `name == "x"` / `name != "x"` clauses joined by `and`."""
    config = yaml.safe_load((REPO / "collector-config" / "otelcol.yaml").read_text())
    for policy in config["processors"]["tail_sampling"]["policies"]:
        for condition in policy.get("ottl_condition", {}).get("span", []):
            holds = []
            for clause in condition.split(" and "):
                match = re.fullmatch(r'name (==|!=) "([^"]+)"', clause.strip())
                assert match, f"the test cannot read {condition!r}"
                holds.append((match.group(2) == span_name) == (match.group(1) == "=="))
            if all(holds):
                return True
    return False


# Every span a sampled step's trace holds (docs/telemetry.md, one trace per sampled step):
# each rank's step span, the job's root, the step's wait for data.
STEP_TRACE_SPANS = (semconv.SPAN_STEP, semconv.SPAN_JOB_STEP, SPAN_PREFIX + phase_names.PHASE_DATA_WAIT)


def test_tail_sampling_keeps_the_spans_the_trace_queries_select():
    for query in blocks("traceql"):
        for name in re.findall(r'\bname\s*=\s*"([^"]+)"', query):
            if name != semconv.SPAN_STEP:  # steps: anomalies and the baseline (see the doc)
                assert _kept_by_policy(name), name
    assert _kept_by_policy("GET") and _kept_by_policy(SPAN_PREFIX + "upload")  # children of phases, user phases


def test_tail_sampling_leaves_an_ordinary_step_trace_to_the_baseline():
    """A policy keeps a trace when any of its spans matches: no span of a step's trace may
    match the run-traces condition, or every step of every rank is kept."""
    assert [name for name in STEP_TRACE_SPANS if _kept_by_policy(name)] == []


# --- PromQL against a real Prometheus -------------------------------------------------------------
@pytest.mark.parametrize("query", blocks("promql"))
def test_promql_names_are_the_packages(query):
    for selector in selectors(query):
        assert selector.name in emitted_series_names(), selector.name
    assert labels_used(query) <= package_labels() | {"le"}


@pytest.mark.slow
@pytest.mark.integration
def test_promql_examples_answer_from_a_real_prometheus_scraping_a_real_training(tmp_path):
    prom.require_binary(prom.PROMETHEUS)
    port = prom.free_port()
    config = tmp_path / "monitor.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "monitor_config": {
                    "interval": 1,
                    "output_type": ["prometheus"],
                    "prometheus": {"host": "127.0.0.1", "port": port},
                    "report_ranks": "all",
                }
            }
        )
    )
    stop_file = tmp_path / "stop"
    trainer = trainer_process.spawn(
        config, tmp_path, steps=100_000, stop_file=stop_file, env={"RANK_ID": "2", "RANK_SIZE": "4"}
    )
    try:
        scrape = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [{"job_name": "train", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
        }
        with prom.prometheus(scrape, tmp_path / "prometheus") as server:
            for query in blocks("promql"):
                answer = _wait_for_answer(server, query)
                assert answer, f"{query!r} gave nothing\n{trainer_process.log_tail(tmp_path)}"
                assert {series["metric"].get("training_rank") for series in answer} == {"2"}, answer
            exemplars = prom._get_json(
                f"{server.url}/api/v1/query_exemplars?"
                + urllib.parse.urlencode(
                    {"query": blocks("promql")[-1], "start": time.time() - 600, "end": time.time()}
                )
            )
            assert exemplars["status"] == "success"  # the scrape path carries none (see the doc)
    finally:
        stop_file.touch()
        assert trainer.wait(timeout=120) == 0, trainer_process.log_tail(tmp_path)


def _wait_for_answer(server, query: str, timeout: float = 60.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = [s for s in server.query(query) if s["value"][1] not in ("NaN",)]
        if answer:
            return answer
        time.sleep(0.5)
    return []
