"""A name the docs call a gauge, counter, histogram or metric is one the package emits: a
reader types it into a query. (docs/flight_recorder.md named a heartbeat gauge
`training.heartbeat.step` that never existed; the gauge is `mindformers.progress.step`.)"""

from __future__ import annotations

import re

import pytest

from otel_mindformers.names import semconv
from tests.support.paths import REPO

DOCS = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md", REPO / "collector-config" / "README.md"]
# "the heartbeat gauge `x.y`", "gauge (`x.y`)", "`x.y` counter"; not table rows, whose cells say the kind of another name.
CALLED_A_METRIC = re.compile(
    r"(?:gauges?|counters?|histograms?|metrics?) \(?`([a-z]+\.[a-z0-9_.]+)`|`([a-z]+\.[a-z0-9_.]+)`\)? (?:gauges?|counters?|histograms?)\b"
)


@pytest.mark.parametrize("page", DOCS, ids=[str(page.relative_to(REPO)) for page in DOCS])
def test_every_name_called_a_metric_is_emitted(page):
    emitted = {metric.name for metric in semconv.all_metrics()}
    called = {
        match.group(1) or match.group(2)
        for line in page.read_text().splitlines()
        if not line.startswith("|")
        for match in CALLED_A_METRIC.finditer(line)
    }
    assert called - emitted == set()
