"""Bad input: whatever the YAML holds, the loader answers with one ConfigError or a config;
whatever shape a train cell returns, training goes on with a warning.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import string
import typing

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_mindformers.config import ConfigError, MonitorConfig, load_monitor_config

# --- config fuzzing --------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
yaml_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=8), st.integers(), st.booleans(), st.none()), children, max_size=4),
    ),
    max_leaves=12,
)

# The loader creates and imports nothing; the fuzzed paths and module names stay harmless
# anyway, should that ever change.
_SAFE_PATH_CHARS = string.ascii_letters + string.digits + "_-."
safe_paths = st.lists(
    st.text(alphabet=_SAFE_PATH_CHARS, min_size=1, max_size=8).filter(lambda part: part not in (".", "..")),
    min_size=1,
    max_size=3,
).map(lambda parts: "fuzz/" + "/".join(parts))
safe_dotted = st.one_of(
    st.just("fuzz_no_such_package.Monitor"),
    st.text(alphabet=string.ascii_letters, min_size=1, max_size=6).map(lambda n: f"fuzz_no_such_{n}.X"),
    st.text(max_size=12).filter(lambda text: "." not in text),
)
_GUARDED = {"json_log_path": safe_paths, "tensorboard_path": safe_paths, "custom_monitor_callback": safe_dotted}


def _section(cls: type) -> st.SearchStrategy[dict]:
    """A mapping for the dataclass `cls`: its keys and aliases with fuzzed values, nested
    sections recursively, and now and then a key it does not know."""
    hints = typing.get_type_hints(cls)
    entries: dict[str, st.SearchStrategy] = {}
    for field in dataclasses.fields(cls):
        tp = hints[field.name]
        if field.name in _GUARDED:
            value = _GUARDED[field.name]
        elif dataclasses.is_dataclass(tp):
            value = st.one_of(st.deferred(lambda tp=tp: _section(tp)), yaml_values)
        elif typing.get_origin(tp) is list and dataclasses.is_dataclass(typing.get_args(tp)[0]):
            item = typing.get_args(tp)[0]
            value = st.one_of(st.lists(st.deferred(lambda item=item: _section(item)), max_size=2), yaml_values)
        else:
            value = yaml_values
        for name in (field.name, *field.metadata.get("aliases", ())):
            entries[name] = value
    known = st.fixed_dictionaries({}, optional=entries)
    unknown = st.dictionaries(st.text(max_size=10), yaml_values, max_size=1)
    return st.tuples(known, unknown).map(lambda pair: {**pair[1], **pair[0]})


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fuzz")
    cwd = os.getcwd()
    os.chdir(directory)
    try:
        yield directory
    finally:
        os.chdir(cwd)


def _load_or_config_error(source) -> None:
    try:
        config = load_monitor_config(source)
    except ConfigError as exc:
        assert str(exc).strip(), "a ConfigError must say what is wrong"
        return
    assert isinstance(config, MonitorConfig)
    config.validate()  # what loaded must stay valid when re-checked


_FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.slow
@_FUZZ
@given(section=_section(MonitorConfig))
def test_fuzzed_mapping_gives_config_or_config_error(fuzz_dir, section):
    _load_or_config_error(section)
    _load_or_config_error({"monitor_config": section})


@pytest.mark.slow
@_FUZZ
@given(section=st.one_of(_section(MonitorConfig), yaml_values))
def test_fuzzed_yaml_file_gives_config_or_config_error(fuzz_dir, section):
    path = fuzz_dir / "monitor.yaml"
    path.write_text(yaml.safe_dump({"monitor_config": section}, allow_unicode=True))
    _load_or_config_error(str(path))


@_FUZZ
@given(text=st.text(max_size=200))
def test_arbitrary_text_file_gives_config_or_config_error(fuzz_dir, text):
    path = fuzz_dir / "monitor.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _load_or_config_error(str(path))


def test_unreadable_encoding_is_a_config_error(fuzz_dir):
    path = fuzz_dir / "latin1.yaml"
    path.write_bytes("monitor_config:\n  service_name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="latin1.yaml"):
        load_monitor_config(str(path))


# --- malformed net_outputs -------------------------------------------------------------------


def _odd_train_cell(kind: str):
    """A real TrainOneStepCell whose construct returns an unusual output shape."""
    import mindspore as ms
    from mindspore import nn, ops

    class OddOutputs(nn.TrainOneStepCell):
        def construct(self, *inputs):
            loss = super().construct(*inputs)
            if kind == "pair":
                return loss, loss * 2
            if kind == "quad":
                return loss, ops.zeros((), ms.bool_), loss, loss
            if kind == "nested":
                return (loss, loss), loss
            if kind == "matrix":
                return ops.ones((3, 4), ms.float32) * loss
            if kind == "empty":
                return ops.zeros((0,), ms.float32)
            if kind == "int_loss":
                return loss.astype(ms.int32)
            raise ValueError(kind)

    return OddOutputs


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pair", "quad", "nested", "matrix", "empty", "int_loss"])
def test_malformed_net_outputs_warn_and_training_continues(workdir, caplog, kind):
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model

    from otel_mindformers.runtime.callback import MonitorCallback
    from tests.support import training

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    net = training._Regressor()
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    train_net = _odd_train_cell(kind)(nn.WithLossCell(net, nn.MSELoss()), optimizer)
    callback = MonitorCallback(
        {
            "interval": 1,
            "output_type": ["json_file"],
            "monitored_metrics": ["loss", "overflow", "loss_scale"],
            "grad_monitor": False,
        }
    )
    steps = 6
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        Model(train_net).train(1, training.build_dataset(steps), callbacks=[callback], dataset_sink_mode=False)

    lines = [json.loads(line) for line in (workdir / "output" / "train_metric.json").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, steps + 1))
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("otel_mindformers")]
    messages = [r.getMessage() for r in warnings]
    assert len(set(messages)) == len(messages), "each problem is reported once, not once per step"
    if kind in ("pair", "quad", "nested", "empty"):
        assert any("net_outputs" in m or "step outputs" in m for m in messages), messages


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"shutdown_timeout": float("inf")}, "monitor_config.shutdown_timeout"),
        ({"otlp": {"export_interval": float("nan")}}, "monitor_config.otlp.export_interval"),
        ({"alert_config": {"loss_threshold": float("nan")}}, "monitor_config.alert_config.loss_threshold"),
        ({"prometheus": {"port": 70000}}, "monitor_config.prometheus.port"),
        ({"step_spans": 0}, "monitor_config.step_spans"),
        ({"otlp": {"temporality": "deltas"}}, "monitor_config.otlp.temporality"),
        ({"otlp": {"headers": {"x-team": 7}}}, "monitor_config.otlp.headers.x-team"),
    ],
)
def test_values_that_would_fail_at_run_time_are_refused_at_load(workdir, section, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_monitor_config(section)


# --- large and hostile YAML ------------------------------------------------------------------


def _write(directory, text: str):
    path = directory / "monitor.yaml"
    path.write_text(text)
    return str(path)


def test_the_c_loader_is_used_where_present():
    from otel_mindformers.config import yaml_loader as config

    assert config._Loader is getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@pytest.mark.parametrize("style", ["block", "flow"])
def test_deeply_nested_yaml_is_a_config_error(workdir, style):
    depth = 900  # under libyaml's own limit of 1000: the pure-Python loader overflows the stack
    if style == "block":
        text = "monitor_config:\n  mindformers_extra:\n" + "".join(" " * (4 + i) + "k:\n" for i in range(depth))
    else:
        text = "monitor_config: {dump_path: " + "[" * depth + "]" * depth + "}\n"
    with pytest.raises(ConfigError, match=r"nested more than 64 levels deep"):
        load_monitor_config(_write(workdir, text))


def test_deeply_nested_mapping_from_code_is_a_config_error(workdir):
    nested: dict = {}
    for _ in range(5000):
        nested = {"k": nested}
    with pytest.raises(ConfigError, match=r"monitor_config: nested more than 64 levels deep"):
        load_monitor_config({"dump_path": nested})


BOMB = "\n".join(
    ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    + [
        f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]"
        for i in range(1, 9)
    ]
)  # a8 stands for 10**9 values


@pytest.mark.parametrize("where", ["a native key", "another top-level key"])
def test_alias_bomb_in_any_key_is_refused(workdir, where):
    if where == "a native key":
        text = "monitor_config:\n  " + BOMB.replace("\n", "\n  ") + "\n  dump_path: *a8\n"
        text = text.replace("  a0:", "  throughput_baseline:", 1)  # the anchors sit in native keys
    else:
        text = BOMB + "\nmonitor_config: {dump_path: *a8}\n"
    with pytest.raises(ConfigError, match=r"more than 100000 values once its aliases are expanded"):
        load_monitor_config(_write(workdir, text))


def test_shared_objects_from_code_are_bounded_like_aliases(workdir):
    """A MindFormerConfig built from an alias bomb holds one object many times over."""
    value: list = ["x"] * 10
    for _ in range(8):
        value = [value] * 10
    with pytest.raises(ConfigError, match=r"monitor_config: more than 100000 values"):
        load_monitor_config({"monitor_config": {"interval": 2, "dump_path": value}})


def test_oversized_file_is_not_read(workdir):
    path = _write(workdir, "monitor_config:\n  interval: 2\n" + "# padding\n" * 500_000)
    with pytest.raises(ConfigError, match=r"monitor.yaml: larger than 4 MiB"):
        load_monitor_config(path)


def test_duplicate_keys_are_refused_with_both_lines(workdir):
    path = _write(workdir, "monitor_config:\n  interval: 5\n  output_type: [stdout]\n  interval: 50\n")
    with pytest.raises(ConfigError, match=r"line 4: key 'interval' given twice in one mapping \(first at line 2\)"):
        load_monitor_config(path)


def test_merge_keys_are_not_duplicates(workdir):
    path = _write(
        workdir, "base: &base {interval: 5, output_type: [stdout]}\nmonitor_config:\n  <<: *base\n  interval: 7\n"
    )
    config = load_monitor_config(path)
    assert (config.interval, config.output_type) == (7, ["stdout"])


@pytest.mark.slow
def test_largest_accepted_values_train_to_the_end(workdir):
    """Every bounded number at its bound reaches the subsystems that use it (deques,
    rotation loops, timeouts) and the run still starts, trains and ends."""
    from otel_mindformers.config import limits as cfg
    from otel_mindformers.runtime.callback import MonitorCallback
    from tests.support import training

    spike = {"window": 1_000_000, "warmup": cfg.MAX_INTEGER, "zscore": 1e300}
    callback = MonitorCallback(
        {
            "interval": cfg.MAX_INTEGER,
            "output_type": ["json_file"],
            "shutdown_timeout": cfg.MAX_SECONDS,
            "tokens_per_sample": cfg.MAX_INTEGER,
            "step_spans": cfg.MAX_INTEGER,
            "device_monitor": True,
            "device_config": {"poll_interval": cfg.MAX_SECONDS, "command_timeout": cfg.MAX_SECONDS},
            "log_rotation": {"max_bytes": 1, "backup_count": 1000, "tensorboard_max_files": cfg.MAX_INTEGER},
            "alert_config": {
                "enable_alert": True,
                "alert_interval": cfg.MAX_INTEGER,
                "loss_threshold": 1e300,
                "overflow_streak": cfg.MAX_INTEGER,
                "stall_timeout": cfg.MAX_SECONDS,
                "notify_timeout": cfg.MAX_SECONDS,
                "notify_retries": 100,
                "stop_after_anomalous_steps": cfg.MAX_INTEGER,
                "loss_spike": spike,
                "grad_norm_spike": spike,
                "step_time_regression": {"window": 1_000_000, "warmup": cfg.MAX_INTEGER, "factor": 1e300},
            },
        }
    )
    steps = 5
    training.train([callback], steps=steps)
    lines = (workdir / "output" / "train_metric.json").read_text().splitlines()
    lines += (workdir / "output" / "train_metric.json.1").read_text().splitlines()
    assert {json.loads(line)["step"] for line in lines} == {1, steps}  # the first and the last
