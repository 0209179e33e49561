"""`grad_monitor`: unset reads the global norm where the network returns it, silently; only a
user who asked for it (`true`) hears that the network does not return one."""

import json
import logging

import pytest

from otel_mindformers import MonitorCallback
from tests.support import training

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]  # real training runs

MISSING_NORM = "no global gradient norm"


def _run(workdir, caplog, shape: str, **overrides):
    config = {"interval": 1, "output_type": ["json_file"], "json_log_path": str(workdir / "m.json"), **overrides}
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        training.train([MonitorCallback(config)], steps=3, shape=shape)
    lines = [json.loads(line) for line in (workdir / "m.json").read_text().splitlines()]
    warned = [r for r in caplog.records if MISSING_NORM in r.getMessage()]
    return lines, warned


def test_unset_grad_monitor_says_nothing_when_the_network_returns_no_norm(workdir, caplog):
    lines, warned = _run(workdir, caplog, "scalar")
    assert warned == []
    assert all("grad_norm" not in line for line in lines)


def test_unset_grad_monitor_reports_the_norm_the_network_returns(workdir, caplog):
    lines, warned = _run(workdir, caplog, "tuple5")
    assert warned == []
    assert all(line["grad_norm"] > 0 for line in lines)


@pytest.mark.parametrize(("asked", "warnings"), [(True, 1), (False, 0)])
def test_an_explicit_grad_monitor_is_honoured(workdir, caplog, asked, warnings):
    lines, warned = _run(workdir, caplog, "scalar", grad_monitor=asked)
    assert len(warned) == warnings
    assert all("grad_norm" not in line for line in lines)
