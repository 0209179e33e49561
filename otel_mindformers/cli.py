"""`otel-mindformers`: command-line tools around `monitor_config` and its logs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from otel_mindformers.analysis.commands import add_commands as add_analysis_commands
from otel_mindformers.captures.offline.capture_command import add_command as add_capture_command
from otel_mindformers.compat import releases
from otel_mindformers.config import ConfigError, MonitorConfig, load_monitor_config
from otel_mindformers.devices.devices_command import add_command as add_devices_command
from otel_mindformers.hangs.offline.hang_report import add_command as add_hang_report_command
from otel_mindformers.version import __version__


def _declarative(path: str) -> bool:
    """An OTel declarative configuration file (OTEL_CONFIG_FILE's): a mapping with `file_format`."""
    from otel_mindformers.config.yaml_loader import read_yaml

    try:
        document = read_yaml(Path(path))
    except (ConfigError, OSError):  # the monitor_config loader says what is wrong with it
        return False
    return isinstance(document, Mapping) and "file_format" in document


def _monitor_config_of(path: str) -> tuple[MonitorConfig, str]:
    """The monitor configuration a run would take from `path`, and what the file is: a
    monitor_config YAML, or an OTEL_CONFIG_FILE whose `instrumentation/development: python:
    mindformers:` entry is one (loaded as opentelemetry-configuration loads it)."""
    if not _declarative(path):
        return load_monitor_config(path), ""
    from otel_mindformers.telemetry import config_file

    declared = config_file.read_file(path)
    config = declared.monitor_config() or MonitorConfig()
    if not declared.enabled:
        config.enable = False
    entry = "its" if declared.options is not None else f"no {config_file.OPTIONS_KEY} entry, the default"
    return config, f"an OTEL_CONFIG_FILE, {entry} monitor configuration: "


def _validate(args: argparse.Namespace) -> int:
    """Every problem of the file at once: its keys and values, the output paths, the custom
    monitor class, the optional packages the enabled outputs need, and with an `otlp` output
    the OTEL_EXPORTER_OTLP_* and OTEL_METRIC_EXPORT_INTERVAL variables of this environment, as
    a run started here reads them. Creates nothing. An
    OTEL_CONFIG_FILE (OTel's declarative configuration) is checked too: the file as
    opentelemetry-configuration loads it, and its `mindformers` entry."""
    kind = ""
    try:
        config, kind = _monitor_config_of(args.config)
    except ConfigError as exc:
        problems = exc.problems
    else:
        from otel_mindformers.config.extras import missing_extras
        from otel_mindformers.outputs.paths import check_output_paths
        from otel_mindformers.runtime.custom_monitors import load_monitor_class

        missing = missing_extras(config)
        problems = check_output_paths(config) + missing
        try:
            load_monitor_class(config)  # imports the user's module: validate's job, not the loader's
        except ConfigError as exc:
            problems += exc.problems
        if _reads_otlp_variables(config, kind) and not missing:  # without the exporters' package: nothing to build
            problems += _otlp_variable_problems(config)
    if problems:
        for problem in problems:
            print(f"invalid: {problem}", file=sys.stderr)
        return 1
    warnings = [config.alert_config.ignored_while_off(stall_used=config.cluster.tell)]
    if _reads_otlp_variables(config, kind) and _builds_own_otlp_exporters(config):
        warnings.append(config.otlp.export_interval_warning())
    for warning in filter(None, warnings):  # valid, and what the run would warn about
        print(f"warning: {warning}", file=sys.stderr)
    for outside in releases.outside_tested_range():
        print(f"warning: {outside}", file=sys.stderr)
    print(f"found {releases.found()}")
    state = "enabled" if config.enable else "disabled (enable: false)"
    outputs = ", ".join(dict.fromkeys(config.output_type)) or "none"
    print(f"{args.config}: valid; {kind}monitoring {state}, every {config.interval} steps, outputs: {outputs}")
    return 0


def _reads_otlp_variables(config: MonitorConfig, kind: str) -> bool:
    """A run of a monitor_config file (not an OTEL_CONFIG_FILE's entry) with an otlp output;
    checked before the SDK is imported, which other configurations' `validate` does not need."""
    return config.enable and not kind and "otlp" in config.output_type


def _builds_own_otlp_exporters(config: MonitorConfig) -> bool:
    from otel_mindformers.telemetry.providers import builds_own_otlp_exporters  # the SDK: only when asked

    return builds_own_otlp_exporters(config.telemetry)


def _otlp_variable_problems(config: MonitorConfig) -> list[str]:
    """What a run in this environment would refuse of the OTEL_EXPORTER_OTLP_* variables,
    checked as the run checks them (an OTEL_CONFIG_FILE's exporters are the file's)."""
    from otel_mindformers.telemetry.providers import check_own_exporters

    try:
        check_own_exporters(config.telemetry).shut_down()  # validate starts no run
    except ConfigError as exc:
        return exc.problems
    return []


# Every subcommand beside `validate`, each registered by its feature (in `--help`'s order):
# report / plot / replay (analysis/), devices (devices/), hang-report (hangs/), capture (captures/).
COMMANDS: tuple[Callable[[Any], None], ...] = (
    add_analysis_commands,
    add_devices_command,
    add_hang_report_command,
    add_capture_command,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="otel-mindformers", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    validate = commands.add_parser("validate", help="check a monitor_config YAML before training")
    validate.add_argument(
        "config",
        help="YAML file with a monitor_config section (or the section itself), or an OTEL_CONFIG_FILE",
    )
    validate.set_defaults(func=_validate)
    for add_command in COMMANDS:
        add_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
