"""One place patches MindSpore and MindFormers, and only when the instrumentation is wanted.

Each case runs in a fresh interpreter: what `import otel_mindformers` does to a process is
the subject, and this test process has imported (and patched) everything already.
"""

import json
import sys

import pytest

from tests.support.instrumented import child_env, instrumented, run
from tests.support.paths import MINDFORMERS_YAML as ARTICLE_YAML

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]  # fresh interpreters importing MindSpore / MindFormers


# Prints which of the patch points are not the library's own, after importing both libraries.
PATCH_REPORT = f"""
import json
import otel_mindformers  # noqa: F401
import mindformers
from mindformers.tools.register import MindFormerModuleType, MindFormerRegister, template
from mindformers.trainer.base_trainer import BaseTrainer
from mindspore.train import Model

patched = {{
    "Config.apply": type(template.Config.__dict__["apply"]) is not classmethod,
    "BaseTrainer.training_process": hasattr(BaseTrainer.__dict__["training_process"], "__wrapped__"),
    "Model.train": hasattr(Model.__dict__["train"], "__wrapped__"),
    "Model.fit": hasattr(Model.__dict__["fit"], "__wrapped__"),
    "callback registry": MindFormerRegister.is_exist(MindFormerModuleType.CALLBACK, "MonitorCallback"),
}}
try:
    article = mindformers.MindFormerConfig({str(ARTICLE_YAML)!r}).monitor_config.enable
except KeyError as exc:
    article = "rejected: " + str(exc)
print("REPORT " + json.dumps({{"patched": patched, "article": article}}))
"""


def _report(workdir, command, **env):
    (workdir / "report.py").write_text(PATCH_REPORT)
    result = run([*command, "report.py"], child_env(**env), workdir)
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("REPORT ")]
    return json.loads(line[len("REPORT ") :])


def test_importing_the_package_imports_neither_mindspore_nor_mindformers(tmp_path):
    script = (
        "import sys, otel_mindformers, otel_mindformers.integration.instrumentor; "
        "loaded = [m for m in ('mindspore', 'mindformers') if m in sys.modules]; "
        "assert not loaded, loaded; print('clean')"
    )
    result = run([sys.executable, "-c", script], child_env(), tmp_path)
    assert result.stdout.strip() == "clean"


@pytest.mark.mindformers
@pytest.mark.parametrize("zero_code", [False, True], ids=["import", "opentelemetry-instrument"])
def test_disabled_instrumentation_patches_nothing(workdir, zero_code):
    command = instrumented("python") if zero_code else [sys.executable]
    report = _report(
        workdir,
        command,
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="requests, mindformers",
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
    )
    assert not any(report["patched"].values()), report
    # MindFormers is itself again: it refuses the article's keys, as it does without us.
    assert report["article"].startswith("rejected:") and "enable" in report["article"]


@pytest.mark.mindformers
def test_disabling_everything_with_a_wildcard_patches_nothing(workdir):
    report = _report(workdir, [sys.executable], OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="*")
    assert not any(report["patched"].values()), report


@pytest.mark.mindformers
def test_import_registers_the_mindformers_integration_only(workdir):
    """A user's script that imports the package keeps the article's keys and the callback
    name; MindSpore's Model is left as it is (that is instrument()'s job)."""
    report = _report(workdir, [sys.executable])
    assert report["patched"] == {
        "Config.apply": True,
        "BaseTrainer.training_process": True,
        "Model.train": False,
        "Model.fit": False,
        "callback registry": True,
    }
    assert report["article"] is True


@pytest.mark.mindformers
def test_opentelemetry_instrument_patches_every_point(workdir):
    report = _report(
        workdir,
        instrumented("python"),
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
    )
    assert all(report["patched"].values()), report
    assert report["article"] is True
