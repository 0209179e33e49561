"""Real MindFormers 1.9: the article's `monitor_config` in a MindFormers YAML, the registered
callback, and the article's main code training a tiny LLaMA on the CPU.

Importing mindformers creates ./output/log in the working directory: every test that needs
it runs in a temp dir (`workdir`).
"""

import copy
import re

import pytest
import yaml

import otel_mindformers
from otel_mindformers import ConfigError, MonitorCallback
from otel_mindformers.config import parse_monitor_config
from otel_mindformers.integration import mindformers_glue
from otel_mindformers.integration.instrumentor import MindFormersInstrumentor
from otel_mindformers.names import semconv
from otel_mindformers.names import training as tm
from tests.support.instrumented import child_env, instrumented, run
from tests.support.jsonl import json_lines
from tests.support.mindformers_trainer import CPU_RUNNER, as_logged, write_trainer
from tests.support.paths import EXAMPLES, REFERENCE_YAML
from tests.support.paths import MINDFORMERS_YAML as ARTICLE_YAML

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api, pytest.mark.mindformers]  # real training runs


@pytest.fixture
def mf(workdir):
    import mindformers

    return mindformers


def load(workdir, monitor_config=None, **sections):
    """A MindFormers training config from YAML text, through MindFormers' own loader."""
    from mindformers import MindFormerConfig

    document = {"run_mode": "train", **sections}
    if monitor_config is not None:
        document["monitor_config"] = monitor_config
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(document))
    return MindFormerConfig(str(path))


def ours(section):
    return parse_monitor_config(mindformers_glue.monitor_section(section))


# --- monitor_config in MindFormers' config loader ---------------------------------------------


def test_the_article_section_loads_beside_mindformers_own_keys(mf):
    section = mf.MindFormerConfig(str(ARTICLE_YAML)).monitor_config
    # The article's keys, as the article's code reads them.
    assert (section.enable, section.interval, section.alert_config.loss_threshold, section.custom_monitor_callback) == (
        True,
        2,
        8.0,
        "custom_monitor.CustomMetricMonitor",
    )
    # MindFormers' keys, with its defaults, as its TrainingStateMonitor reads them.
    assert (
        section.monitor_on,
        section.step_interval,
        section.dump_path,
        section.weight_state_format,
        section.invert,
        section.target,
    ) == (True, 1, "./output/dump", ["log"], False, None)
    config = ours(section)
    assert (config.enable, config.interval, config.output_type) == (True, 2, ["stdout", "tensorboard", "json_file"])
    assert config.mindformers_native["weight_state_format"] == ["log"]


def test_mindformers_defaults_nobody_wrote_do_not_configure_us(mf, workdir):
    section = load(workdir, {"enable": True, "output_type": ["stdout"]}).monitor_config
    assert "monitor_on" not in section and "step_interval" not in section
    assert "dump_path" in section  # MindFormers' other defaults stay
    assert ours(section).interval == 10  # ours, not MindFormers' step_interval default of 1

    unset = load(workdir).monitor_config
    assert "enable" not in mindformers_glue.monitor_section(unset)


def test_both_spellings_configure_each_its_own_monitor(mf, workdir):
    section = load(workdir, {"enable": False, "interval": 20, "monitor_on": True, "step_interval": 5}).monitor_config
    assert (section.monitor_on, section.step_interval) == (True, 5)
    assert (ours(section).enable, ours(section).interval) == (False, 20)


def test_a_native_only_section_still_configures_us_through_the_aliases(mf, workdir):
    section = load(workdir, {"monitor_on": True, "step_interval": 4}).monitor_config
    assert (ours(section).enable, ours(section).interval) == (True, 4)


def test_a_custom_monitor_beside_the_mindformers_yaml_is_found_from_elsewhere(mf, workdir):
    """The YAML's folder is importable (docs/custom_monitors.md) also when MindFormers loads the
    YAML, which keeps no file name: a run from another folder found no module beside it."""
    from otel_mindformers import load_monitor_config
    from otel_mindformers.runtime.custom_monitors import load_monitor_class

    folder = workdir / "conf"
    folder.mkdir()
    (folder / "beside_yaml_monitor.py").write_text(
        "from otel_mindformers import BaseMonitor\n\nclass Beside(BaseMonitor):\n    pass\n"
    )
    (folder / "train.yaml").write_text(
        yaml.safe_dump(
            {"run_mode": "train", "monitor_config": {"custom_monitor_callback": "beside_yaml_monitor.Beside"}}
        )
    )
    config = mf.MindFormerConfig(str(folder / "train.yaml"))  # the working directory is `workdir`
    run_config = mindformers_glue._run_monitor_config(config, listed=True, zero_code=None)
    assert run_config is not None and run_config.source_dir == str(folder)
    assert load_monitor_class(run_config).__name__ == "Beside"
    assert load_monitor_config(config).source_dir == str(folder)  # the article's `config` handed to us


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"interval": 0}, r"monitor_config\.interval: must be >= 1, got 0"),
        ({"intervl": 5}, r"monitor_config\.intervl: unknown key \(did you mean 'interval'\?\)"),
        (
            {"output_type": ["stdout", "jsonfile"]},
            r"monitor_config\.output_type: unknown value 'jsonfile' \(did you mean 'json_file'\?\)",
        ),
    ],
)
def test_a_bad_section_is_one_config_error_naming_the_key(mf, workdir, section, message):
    with pytest.raises(ConfigError, match=message):
        load(workdir, section)


def test_yaml_callbacks_entry_builds_our_callback(mf):
    from mindformers.core import build_callback

    callback = build_callback({"type": "MonitorCallback", "config": {"interval": 3, "output_type": ["stdout"]}})
    assert isinstance(callback, MonitorCallback) and callback.config.interval == 3


def test_unregister_gives_mindformers_back_its_own_behaviour(mf, workdir):
    from mindformers.tools.register import MindFormerModuleType, MindFormerRegister, template
    from mindformers.trainer.base_trainer import BaseTrainer

    instrumentor = MindFormersInstrumentor()
    instrumentor.unregister()
    try:
        assert type(template.Config.__dict__["apply"]) is classmethod
        applied = template.MonitorConfig.apply({"monitor_on": True})  # bound to the subclass: its defaults
        assert "step_interval" in applied and applied["dump_path"] == template.MonitorConfig.dump_path
        assert not hasattr(BaseTrainer.__dict__["training_process"], "__wrapped__")
        assert not MindFormerRegister.is_exist(MindFormerModuleType.CALLBACK, "MonitorCallback")
        with pytest.raises(KeyError, match="unexpected key: enable"):
            mf.MindFormerConfig(str(ARTICLE_YAML))
    finally:
        instrumentor.register()
    assert mf.MindFormerConfig(str(ARTICLE_YAML)).monitor_config.enable is True


def test_uninstrument_keeps_what_the_import_installed(mf, workdir):
    otel_mindformers.instrument()
    otel_mindformers.uninstrument()
    assert mf.MindFormerConfig(str(ARTICLE_YAML)).monitor_config.enable is True


# --- real Trainer runs (subprocesses: MindFormers + a tiny LLaMA, CPU patches applied) ---------------

_MF_STEP = re.compile(
    r"step:\[\s*(\d+)/\s*\d+\], loss:\[([\d.]+)/[\d.]+\].*?lr: ([\d.e-]+), overflow cond: (\w+), "
    r"loss_scale: ([\d.]+), global_norm: \[([\d.]+)\]"
)


def test_the_article_main_code_trains_a_tiny_llama_with_monitoring(workdir):
    """`python examples/mindformers_train.py`: `import otel_mindformers` and the YAML are all it takes."""
    result = run([*CPU_RUNNER, str(EXAMPLES / "mindformers_train.py")], child_env(), workdir)
    output = result.stdout + result.stderr
    assert "monitoring on, every 2 steps" in output

    lines = json_lines(workdir / "output" / "train_metric.json")
    records = [line for line in lines if "epoch" in line]  # ours; the custom monitor's have no epoch
    custom = [line for line in lines if "epoch" not in line]
    assert [r["step"] for r in records] == [1, 2, 4]
    assert [c["step"] for c in custom] == [1, 2, 3, 4]  # the article's custom monitor, every step
    # The values are MindFormers' own: its MFLossMonitor prints the same 5-tuple we read.
    printed = {int(m[1]): m.groups()[1:] for m in _MF_STEP.finditer(output)}
    assert sorted(printed) == [1, 2, 3, 4]
    for r in records:
        loss, lr, overflow, scale, norm = printed[r["step"]]
        assert r["loss"] == as_logged(loss, rel=1e-5)
        assert r["learning_rate"] == as_logged(lr, rel=1e-5)
        assert r["grad_norm"] == as_logged(norm, rel=1e-5)
        assert (r["overflow"], r["loss_scale"]) == (overflow == "True", float(scale))
        # tokens_per_sample came from the model's seq_length (16)
        assert r["tokens_per_second"] == pytest.approx(r["samples_per_second"] * 16)
    assert [c["loss"] for c in custom if c["step"] in (1, 2, 4)] == pytest.approx([r["loss"] for r in records])

    stdout_lines = [line for line in result.stdout.splitlines() if line.startswith("[otel_mindformers]")]
    assert [int(re.search(r"step (\d+)", line)[1]) for line in stdout_lines] == [1, 2, 4]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(workdir / "output" / "tensorboard_log" / "rank_0"))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == [1, 2, 4]
    # MindFormers' own TrainingStateMonitor still runs from its native keys.
    assert "weight_norm" in output


def test_zero_code_trainer_with_the_callback_listed_in_yaml(workdir, otlp_receiver):
    """opentelemetry-instrument + a YAML `callbacks: - type: MonitorCallback`: one callback, not two."""
    document = yaml.safe_load(ARTICLE_YAML.read_text())
    document["callbacks"].append({"type": "MonitorCallback"})
    section = copy.deepcopy(document["monitor_config"])
    for key in ("custom_monitor_callback", "monitor_on", "dump_path", "weight_state_format"):
        section.pop(key)
    document["monitor_config"] = {**section, "output_type": ["json_file"]}
    script = write_trainer(workdir, yaml.safe_dump(document), rows=4, register=False)

    run(instrumented(*CPU_RUNNER, script), child_env(otlp_receiver, OTEL_SERVICE_NAME="tiny-llama"), workdir)

    (run_span,) = otlp_receiver.spans(semconv.SPAN_RUN)
    assert run_span.resource["service.name"] == "tiny-llama"
    assert sorted(s.attributes[semconv.ATTR_STEP] for s in otlp_receiver.spans(semconv.SPAN_STEP)) == [1, 2]
    lines = json_lines(workdir / "output" / "train_metric.json")
    assert [line["step"] for line in lines] == [1, 2]
    exported = {p.metric for p in otlp_receiver.points()}
    assert {
        tm.instrument_name(tm.LOSS),
        tm.instrument_name(tm.GRAD_NORM),
        tm.instrument_name(tm.LOSS_SCALE),
        tm.instrument_name(tm.TOKENS_PER_SECOND),
    } <= exported


def test_the_shared_reference_yaml_with_its_otelcallback_entry_trains(workdir):
    """The project's reference MindFormers config, verbatim: `callbacks: - type: OtelCallback`
    with `service_name`, and a native-keys-only `monitor_config` (monitor_on, step_interval: 1)."""
    result = run([*CPU_RUNNER, write_trainer(workdir, REFERENCE_YAML.read_text(), rows=6)], child_env(), workdir)
    ours = [line for line in result.stdout.splitlines() if line.startswith("[otel_mindformers]")]
    assert [int(re.search(r"step (\d+)", line)[1]) for line in ours] == [1, 2, 3]  # once per step: one callback
    lines = json_lines(workdir / "output" / "train_metric.json")
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert all({"loss", "grad_norm", "loss_scale", "overflow"} <= set(line) for line in lines)
