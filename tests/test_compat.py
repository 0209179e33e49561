"""The adapters of otel_mindformers/compat/ against the installed MindSpore / MindFormers.

Each adapter finds the private or moved names it stands for on this release; a name that is
not there fails with one error naming the release, the name and what needs it. The version
matrix (scripts/matrix.sh) runs this file on every pair that installs, so a release that
moves an API fails here, named, before anything further away does.
"""

from __future__ import annotations

import ast
import logging
import operator
import re

import pytest

from otel_mindformers.compat import (
    lookup,
    mindformers_api,
    mindspore_cell,
    mindspore_model,
    mindspore_tensor,
    profiler,
    releases,
)
from otel_mindformers.compat.lookup import ApiNotFound
from otel_mindformers.model_state import mindformers_hooks
from tests.support.paths import REPO

pytestmark = pytest.mark.mindspore_api


def _release_named(error: ApiNotFound, package: str) -> None:
    assert str(error).startswith(f"{releases.LABELS[package]} {releases.installed(package)}: "), error


# --- releases -------------------------------------------------------------------------------


def test_the_installed_pair_is_in_the_tested_range_and_the_ranges_agree_with_the_package():
    from otel_mindformers.integration.package import _instruments

    assert releases.outside_tested_range() == [], releases.found()
    assert releases.installed("mindspore") in releases.found()
    assert _instruments == (f"mindspore {releases.tested_range('mindspore')}",)


def test_a_release_outside_the_range_is_warned_once_naming_it(monkeypatch):
    version = releases.installed("mindspore")
    monkeypatch.setitem(releases.TESTED, "mindspore", (f"> {version}",))
    monkeypatch.setattr(releases, "_warned", releases.threading.Event())
    (line,) = releases.first_warning()
    assert line.startswith(f"MindSpore {version} is outside the tested range (MindSpore > {version})"), line
    assert releases.first_warning() == []


@pytest.mark.parametrize(
    ("version", "said"),
    [
        ("2.9.0-ascend-b050", None),  # a vendor's build of 2.9.0: inside, nothing to say
        ("2.7.0rc1.ascend", "outside"),  # before 2.7.0
        ("2.12.0-ascend-b050", "outside"),
        ("ascend-dev", "unrecognised"),
    ],
)
def test_a_vendor_suffixed_version_is_read_by_its_release_numbers(monkeypatch, version, said):
    """'2.9.0-ascend-b050' is no PEP 440 version: it was called outside the tested range
    (issue 46, item 19). Its leading numbers are the release; only a version with none is
    unrecognised, and the line says so."""
    monkeypatch.setattr(releases, "installed", lambda package: version if package == "mindspore" else None)
    lines = releases.outside_tested_range()
    if said is None:
        assert lines == []
    elif said == "outside":
        (line,) = lines
        assert line.startswith(f"MindSpore {version} is outside the tested range (MindSpore >= 2.7.0, < 2.11)"), line
    else:
        (line,) = lines
        assert line.startswith(f"MindSpore {version}: unrecognised version, so whether it is in the tested range"), line
        assert "outside" not in line


def test_validate_names_the_versions_found_and_the_tested_range(tmp_path, capsys):
    from otel_mindformers.cli import main as cli_main

    (tmp_path / "m.yaml").write_text("monitor_config:\n  interval: 5\n")
    assert cli_main(["validate", str(tmp_path / "m.yaml")]) == 0
    said = capsys.readouterr()
    ms, mf = releases.installed("mindspore"), releases.installed("mindformers")
    found = f"MindSpore {ms}, MindFormers {mf or '(not installed)'}"
    assert f"found {found} (tested: MindSpore >= 2.7.0, < 2.11; MindFormers >= 1.6.0, < 1.10)" in said.out
    assert said.err == ""  # inside the range: no warning


@pytest.mark.slow
def test_a_run_names_the_versions_at_its_start(workdir, caplog):
    from otel_mindformers import MonitorCallback
    from tests.support import training

    with caplog.at_level(logging.INFO, logger="otel_mindformers"):
        training.train(
            [MonitorCallback({"output_type": ["json_file"], "json_log_path": str(workdir / "m.json")})], steps=2
        )
    started = [r.getMessage() for r in caplog.records if "monitoring on" in r.getMessage()]
    assert started == [f"otel_mindformers: rank 0 monitoring on {releases.found()}"]
    assert f"MindSpore {releases.installed('mindspore')}" in started[0]


# --- lookup ---------------------------------------------------------------------------------


def test_a_name_that_is_not_there_fails_naming_the_release_the_name_and_the_feature():
    with pytest.raises(ApiNotFound) as caught:
        lookup.find("mindspore.profiler:no_such_profiler", package="mindspore", needed_for="a test's feature")
    _release_named(caught.value, "mindspore")
    message = str(caught.value)
    assert "mindspore.profiler:no_such_profiler is not there (AttributeError" in message
    assert "a test's feature needs it (tested: MindSpore >= 2.7.0, < 2.11)" in message


def test_a_feature_turned_off_is_said_once(caplog):
    error = ApiNotFound("MindSpore 9.9.9: mindspore.x:y is not there")
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        lookup.feature_off("a feature only this test has", error)
        lookup.feature_off("a feature only this test has", error)
    said = [r.getMessage() for r in caplog.records if "a feature only this test has" in r.getMessage()]
    assert said == [
        "otel_mindformers: a feature only this test has is off: MindSpore 9.9.9: mindspore.x:y is not there"
    ]


# --- MindSpore's Model.train ------------------------------------------------------------------


def test_model_train_keeps_its_loop_functions_and_initial_epoch():
    mindspore_model.check_train_loop()


def test_a_train_loop_function_that_moved_is_named_with_the_release(monkeypatch):
    from mindspore.train.model import Model

    monkeypatch.delattr(Model, "_train_dataset_sink_process")
    with pytest.raises(ApiNotFound) as caught:
        mindspore_model.check_train_loop()
    _release_named(caught.value, "mindspore")
    assert "mindspore.train.model:Model._train_dataset_sink_process is not there" in str(caught.value)


@pytest.mark.slow
def test_every_cb_params_key_the_package_reads_is_carried_by_model_train(workdir):
    """A real Model.train on this release: each hook carries the keys CB_PARAMS says it does."""
    from mindspore.train import Callback

    from tests.support import training

    seen: dict[str, list[str]] = {}

    class Recorder(Callback):
        def _check(self, run_context, hook):
            cb_params = run_context.original_args()
            seen.setdefault(hook, mindspore_model.missing_keys(cb_params, hook))
            mindspore_model.check_cb_params(cb_params, hook)

        def on_train_begin(self, run_context):
            self._check(run_context, "on_train_begin")

        def on_train_epoch_begin(self, run_context):
            self._check(run_context, "on_train_epoch_begin")

        def on_train_step_begin(self, run_context):
            self._check(run_context, "on_train_step_begin")

        def on_train_step_end(self, run_context):
            self._check(run_context, "on_train_step_end")

    training.train([Recorder()], steps=3)
    assert seen == dict.fromkeys(mindspore_model.HOOKS, []), seen


def test_a_missing_cb_params_key_is_named_with_the_release_and_what_reads_it():
    with pytest.raises(ApiNotFound) as caught:
        mindspore_model.check_cb_params({"cur_step_num": 1}, "on_train_step_begin")
    _release_named(caught.value, "mindspore")
    assert "train_dataset_element (first at on_train_step_begin; the batch capture's input shapes" in str(caught.value)


_CB_PARAMS_READ = re.compile(r"""cb_params(?:\.get\(|\[)["'](\w+)["']|original_args\(\)\.(?:get\(["'])?(\w+)""")


def test_the_package_reads_no_cb_params_key_the_adapter_does_not_list():
    read = {
        key
        for path in (REPO / "otel_mindformers").rglob("*.py")
        for match in _CB_PARAMS_READ.finditer(path.read_text())
        for key in match.groups()
        if key
    }
    # Set by this package for custom monitors, and Model.fit's evaluation result.
    ours = {"train_loss", "learning_rate", "eval_results"}
    assert read - ours - set(mindspore_model.CB_PARAMS) == set()
    assert "train_dataset_element" in read  # the scan sees the reads


def test_resume_and_stack_dumps_take_model_internals_from_the_adapter():
    """The frames and argument names are the adapter's, not copies."""
    for module in ("job/resume.py", "hangs/stacks.py"):
        tree = ast.parse((REPO / "otel_mindformers" / module).read_text())
        names = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        assert names & {"TRAIN_FRAMES", "LOOP_FUNCTIONS"}, module


# --- Tensor and Cell internals (the readback, the gradient-norm probe) ------------------------


def test_the_readback_is_the_tensors_c_method_on_this_release():
    """`_item`, unbound: a tensor's and a Parameter's one element, in a C call."""
    import mindspore as ms

    ms.set_device("CPU")
    assert mindspore_tensor.read_scalar is ms.Tensor._item
    assert mindspore_tensor.read_scalar(ms.Tensor([2.5], ms.float32)) == 2.5
    assert mindspore_tensor.read_scalar(ms.Parameter(ms.Tensor([3], ms.int32), name="p")) == 3
    assert mindspore_tensor.readable(ms.Parameter(ms.Tensor([1.0]), name="q"))


def test_a_release_without_the_private_readback_reads_through_the_public_one():
    class Released:  # a tensor type as a release without `_item` would have it
        def item(self) -> float:
            return 4.5

    assert mindspore_tensor.scalar_reader(Released)(Released()) == 4.5


def test_shape_dtype_and_the_tensor_check_are_c_attributes_on_this_release():
    """The graph's input check and the sampled reads ask every gradient and value: from C
    attributes, no Python frame (runtime/logged_values.py, compat/mindspore_graph.py)."""
    import mindspore as ms

    ms.set_device("CPU")
    tensor, parameter = ms.Tensor([[1.0, 2.0]], ms.float32), ms.Parameter(ms.Tensor([3], ms.int32), name="s")
    assert mindspore_tensor.shape_and_dtype(tensor) == ((1, 2), ms.float32) == (tensor.shape, tensor.dtype)
    assert mindspore_tensor.shape_and_dtype(parameter) == ((1,), ms.int32)
    assert mindspore_tensor.shape_and_dtype.__class__ is operator.attrgetter
    native = mindspore_tensor.NATIVE_TENSOR
    assert native is not ms.Tensor and native.__module__.startswith("mindspore._c_expression")
    assert isinstance(tensor, native) and isinstance(parameter, native) and not isinstance(2.5, native)
    assert mindspore_tensor.readable(parameter)


def test_a_release_without_the_c_attributes_reads_the_public_ones():
    class Released:  # a tensor type as a release without `_shape` / `_dtype` would have it
        shape, dtype = (2,), "float32"

    assert mindspore_tensor.signature_reader(Released)(Released()) == ((2,), "float32")
    assert mindspore_tensor.native_tensor_type(Released) is Released  # no C base: itself


def test_the_cell_internals_the_probe_uses_are_on_this_release():
    import mindspore as ms
    from mindspore import nn

    ms.set_device("CPU")  # before the first kernel runs (it fixes the device for the process)
    mindspore_cell.check_cell_api()
    dense = nn.Dense(2, 2)
    cell = nn.SequentialCell(dense)
    assert mindspore_cell.own_cells(cell) == {"0": dense}
    assert mindspore_cell.own_cells(dense) == {} and mindspore_cell.own_cells(object()) == {}
    replacement = nn.Dense(2, 2)
    names = {p.name for p in replacement.get_parameters()}
    mindspore_cell.put_child(cell, "0", replacement)
    assert mindspore_cell.own_cells(cell) == {"0": replacement}
    assert {p.name for p in replacement.get_parameters()} == names  # not prefixed
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        assert not mindspore_cell.compiled(cell)
        cell(ms.Tensor([[1.0, 2.0]], ms.float32))
        assert mindspore_cell.compiled(cell)
    finally:
        ms.set_context(mode=previous)


def test_a_moved_cell_internal_is_named_with_the_release(monkeypatch):
    from mindspore import nn

    monkeypatch.delattr(nn.Cell, "insert_child_to_cell")
    with pytest.raises(ApiNotFound) as caught:
        mindspore_cell.check_cell_api()
    _release_named(caught.value, "mindspore")
    assert "mindspore.nn:Cell.insert_child_to_cell is not there" in str(caught.value)
    assert "grad_monitor's gradient-norm probe needs it" in str(caught.value)


# Read as an attribute or named in a string (getattr).
_INTERNALS = re.compile(r"""[.'"](?:_item|_shape|_dtype|compile_cache|_cells|insert_child_to_cell)\b""")


def test_the_package_reaches_tensor_and_cell_internals_only_through_their_adapters():
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sorted((REPO / "otel_mindformers").rglob("*.py"))
        if path.parent.name != "compat"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _INTERNALS.search(line)
    ]
    assert found == []


# --- the profiler -----------------------------------------------------------------------------


def test_the_profiler_names_a_capture_uses_are_on_this_release():
    assert profiler.load_profiler().__name__ == "mindspore.profiler"
    profiler.check_cpu_analysis()


def test_a_moved_cpu_parser_is_named_with_the_release(monkeypatch):
    from mindspore.profiler.platform import cpu_profiler

    monkeypatch.delattr(cpu_profiler, "CPUProfilerAnalysis")
    with pytest.raises(ApiNotFound) as caught:
        profiler.check_cpu_analysis()
    _release_named(caught.value, "mindspore")
    assert "cpu_profiler:CPUProfilerAnalysis.online_analyse is not there" in str(caught.value)
    assert "`otel-mindformers capture --analyse` on a CPU profile needs it" in str(caught.value)


# --- the pre-flight check's stress test (cluster/preflight.py) --------------------------------------


def test_the_stress_test_the_preflight_check_runs_is_on_this_release():
    from otel_mindformers.compat import stress_detect

    function = stress_detect.stress_detect()
    assert function.__name__ == "stress_detect" and function.__module__.startswith("mindspore.")


def test_a_moved_stress_test_is_named_with_the_release(monkeypatch):
    from otel_mindformers.compat import stress_detect

    monkeypatch.setattr(stress_detect, "PLACES", ("mindspore.tools:no_such_stress_detect",))
    with pytest.raises(ApiNotFound) as caught:
        stress_detect.stress_detect()
    _release_named(caught.value, "mindspore")
    assert "cluster.preflight needs it" in str(caught.value)


# --- MindFormers ------------------------------------------------------------------------------


@pytest.mark.mindformers
def test_mindformers_internals_are_where_the_adapter_looks(workdir):
    assert mindformers_api.base_trainer().__name__ == "BaseTrainer"
    assert mindformers_api.config_template().__name__ == "Config"
    assert mindformers_api.monitor_section().__name__ == "MonitorConfig"
    assert mindformers_api.config_file_reader().__name__ == "MindFormerConfig"
    module, loads = mindformers_api.resume_loads()
    assert "transform_and_load_checkpoint" in loads and set(loads) <= set(vars(module))
    for class_name, method, feature in mindformers_api.STATE_HOOKS:
        assert mindformers_api.state_hook(class_name, method, feature).__name__ == class_name
    assert set(mindformers_hooks.WRAPPERS) == {(c, m) for c, m, _ in mindformers_api.STATE_HOOKS}
    for class_name, _attribute in mindformers_api.INITIAL_STEP_ATTRIBUTES:
        lookup.find(f"{mindformers_api.CALLBACKS}:{class_name}", package="mindformers", needed_for="resume")


@pytest.mark.mindformers
def test_a_moved_mindformers_name_is_named_with_the_release(workdir, monkeypatch):
    from mindformers.core.callback import callback

    monkeypatch.delattr(callback.MoEDropRateCallback, "_callback_droprate")
    with pytest.raises(ApiNotFound) as caught:
        mindformers_api.state_hook("MoEDropRateCallback", "_callback_droprate", "the MoE drop-rate series")
    _release_named(caught.value, "mindformers")
    assert "MoEDropRateCallback._callback_droprate is not there" in str(caught.value)
    assert "the MoE drop-rate series needs it (tested: MindFormers >= 1.6.0, < 1.10)" in str(caught.value)
