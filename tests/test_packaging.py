"""Package metadata that must stay true to the code: Python floor, license, declared test
dependencies, registered markers."""

from __future__ import annotations

import tomllib

from tests.support.paths import REPO

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_python_floor_is_the_one_the_code_needs():
    # config/coercion.py parses `X | Y` annotations (types.UnionType), new in 3.10.
    assert "types.UnionType" in (REPO / "otel_mindformers" / "config" / "coercion.py").read_text()
    assert PROJECT["project"]["requires-python"] == ">=3.10"


def test_license_is_an_spdx_string_with_its_text():
    assert PROJECT["project"]["license"] == "Apache-2.0"
    assert PROJECT["project"]["license-files"] == ["LICENSE"]
    assert (REPO / "LICENSE").read_text().lstrip().startswith("Apache License")


def test_every_declared_test_utility_is_used():
    extras = PROJECT["project"]["optional-dependencies"]
    declared = " ".join(extras["test"] + extras["test-tools"])
    tests = " ".join(p.read_text() for p in (REPO / "tests").rglob("*.py"))
    if "opentelemetry-test-utils" in declared:
        assert "opentelemetry.test" in tests, "opentelemetry-test-utils is declared but no test uses it"


def test_markers_are_registered():
    markers = PROJECT["tool"]["pytest"]["ini_options"]["markers"]
    assert {m.split(":")[0] for m in markers} == {
        "slow",
        "integration",
        "mindspore_api",
        "mindformers",
        "msrun_job",
        "msrun_api",
        "analysis",
    }
