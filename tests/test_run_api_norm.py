"""The run API's gradient norm graph (compat/mindspore_graph.py): compiled once per input
signature by MindSpore's own executor and run from its phase, without `jit`'s per-call
wrapper; the same values as `jit`; compiled again when the gradients' shapes or dtypes
change (a phase compiled for other shapes reads them wrongly) and when MindSpore let its
phase go (`mindspore.ms_memory_recycle()`); the plain `jit` call where the release lacks the
private executor."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

import otel_mindformers
from otel_mindformers.compat import lookup, mindspore_graph
from otel_mindformers.runtime import logged_values
from tests.support import custom_loop
from tests.support.jsonl import json_lines

pytestmark = pytest.mark.mindspore_api  # MindSpore's private graph executor

# Before any kernel runs (collection): the custom loop below sets it again, which MindSpore
# refuses once the runtime started on a device nobody set.
ms.set_device("CPU")


def _grads(*shapes: tuple[int, ...], dtype=np.float32, seed: int = 0) -> tuple[ms.Tensor, ...]:
    rng = np.random.default_rng(seed)
    return tuple(ms.Tensor(rng.standard_normal(shape).astype(dtype)) for shape in shapes)


def _expected(grads) -> float:
    return float(np.sqrt(sum(float((g.asnumpy().astype(np.float64) ** 2).sum()) for g in grads)))


def _sum_of_squares_root(grads):
    return ms.ops.sqrt(ms.ops.addn([(g * g).sum() for g in grads]))


@pytest.fixture(params=[ms.PYNATIVE_MODE, ms.GRAPH_MODE], ids=["pynative", "graph"])
def mode(request):
    """A custom loop runs in PyNative, or in graph mode where its step is a Cell or under jit."""
    ms.set_context(mode=request.param)
    yield request.param
    ms.set_context(mode=ms.PYNATIVE_MODE)


def test_the_executor_the_norm_runs_on_is_on_this_release(mode):
    norm = logged_values._global_norm_graph(False)
    assert isinstance(norm, mindspore_graph.CompiledGraph)
    grads = _grads((3, 4), (4,), (2, 2, 2))
    assert float(norm(grads).asnumpy()) == pytest.approx(_expected(grads), rel=1e-5)
    assert float(norm(list(grads)).asnumpy()) == pytest.approx(_expected(grads), rel=1e-5)  # any sequence
    total, squares = logged_values._global_norm_graph(True)(grads)  # with each gradient's squared norm
    assert float(total.asnumpy()) == pytest.approx(_expected(grads), rel=1e-5)
    assert squares.asnumpy() == pytest.approx([_expected([g]) ** 2 for g in grads], rel=1e-5)


def test_new_shapes_or_dtypes_compile_again_and_read_right(mode):
    norm = logged_values._global_norm_graph(False)
    for grads in (
        _grads((3, 4), (4,)),
        _grads((5, 4), (4,), seed=1),  # bigger: the phase of (3, 4) would read 12 values
        _grads((3, 4), (4,), (7,), seed=2),  # one more gradient
        _grads((3, 4), (4,), dtype=np.float16, seed=3),
        _grads((3, 4), (4,), seed=4),  # back to the first signature
    ):
        assert float(norm(grads).asnumpy()) == pytest.approx(_expected(grads), rel=1e-3)


@pytest.mark.slow  # frees every graph the process compiled: the tests after compile theirs again
def test_a_phase_mindspore_let_go_is_compiled_again(mode):
    """`mindspore.ms_memory_recycle()`, which MindSpore advises between two models trained in one
    process, frees every compiled phase: the norm's next call compiles its graph again, as `jit`
    does, instead of failing on every later step."""
    grads = _grads((3, 4), (4,), (2, 2, 2))
    norm, with_squares = logged_values._global_norm_graph(False), logged_values._global_norm_graph(True)
    assert float(norm(grads).asnumpy()) == pytest.approx(_expected(grads), rel=1e-5)
    assert float(with_squares(grads)[0].asnumpy()) == pytest.approx(_expected(grads), rel=1e-5)
    ms.ms_memory_recycle()
    for _ in range(2):  # compiled again, then run from the new phase
        assert float(norm(grads).asnumpy()) == pytest.approx(_expected(grads), rel=1e-5)
        total, squares = with_squares(grads)
        assert float(total.asnumpy()) == pytest.approx(_expected(grads), rel=1e-5)
        assert squares.asnumpy() == pytest.approx([_expected([g]) ** 2 for g in grads], rel=1e-5)


@pytest.mark.slow  # real training
def test_the_run_api_reports_the_norm_after_mindspore_frees_its_graphs(workdir):
    loop = custom_loop.build()
    config = {
        "interval": 1,
        "output_type": ["json_file"],
        "json_log_path": str(workdir / "metrics.json"),
        "monitored_metrics": ["loss", "grad_norm"],
    }
    norms: dict[int, float] = {}
    with otel_mindformers.start(config) as run:
        for step, (x, y) in enumerate(custom_loop.Data(4).batches(), start=1):
            if step == 3:
                ms.ms_memory_recycle()  # as between two models
            with run.step(step):
                loss, grads = loop.train_step(x, y)
                run.log(loss=loss, grads=grads)
            norms[step] = _expected(grads)
    lines = json_lines(workdir / "metrics.json")
    assert [line["step"] for line in lines] == [1, 2, 3, 4]
    for line in lines:
        assert line.get("grad_norm") == pytest.approx(norms[line["step"]], rel=1e-4), line


def test_a_release_without_the_private_executor_runs_the_norm_through_jit(monkeypatch):
    ms.set_context(mode=ms.PYNATIVE_MODE)

    def missing(path, **_):
        raise lookup.ApiNotFound(path)

    monkeypatch.setattr(lookup, "find", missing)
    norm = mindspore_graph.compiled(_sum_of_squares_root)
    assert not isinstance(norm, mindspore_graph.CompiledGraph)
    grads = _grads((3, 4), (4,))
    assert float(norm(grads).asnumpy()) == pytest.approx(_expected(grads), rel=1e-5)
