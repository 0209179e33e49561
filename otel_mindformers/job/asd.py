"""Whether MindSpore's silent-data-corruption detection is on, as resource attributes.

Two switches, read by MindSpore at start: `NPU_ASD_ENABLE` (1, 2 or 3: the feature-value
check of the Norm gradients, logging, stopping, or also printing the values; 0 or unset:
off) and, since MindSpore 2.7.1, `MS_NPU_ASD_CONFIG` (`enable:true,with_checksum:true,...`,
`key:value` or `key=value` items: the feature-value and CheckSum combined detection, which
with `enable:true` makes MindSpore ignore NPU_ASD_ENABLE). MindSpore's "Feature Value Detection" tutorial
describes both; its detection lines are read by cluster/asd.py.
"""

from __future__ import annotations

from collections.abc import Mapping

from otel_mindformers.names import cluster_names as names

MAX_SHOWN = 256  # MS_NPU_ASD_CONFIG is a short list of items; more is not worth a resource attribute


def asd_config(text: str) -> dict[str, str]:
    """`enable:true, with_checksum = false` -> {"enable": "true", "with_checksum": "false"}."""
    items = {}
    for item in text.split(","):
        key, separator, value = item.replace("=", ":", 1).partition(":")
        if separator and key.strip():
            items[key.strip().lower()] = value.strip().lower()
    return items


def asd_attributes(env: Mapping[str, str]) -> dict[str, str | bool]:
    """`mindspore.asd.enabled` always; the switches as set, when set."""
    attributes: dict[str, str | bool] = {}
    legacy = env.get("NPU_ASD_ENABLE", "").strip()
    combined = env.get("MS_NPU_ASD_CONFIG", "").strip()
    config = asd_config(combined)
    combined_on = config.get("enable") == "true"
    enabled = combined_on or legacy in ("1", "2", "3")
    attributes[names.ATTR_ASD_ENABLED] = enabled
    if legacy:
        attributes[names.ATTR_ASD_NPU_ASD_ENABLE] = legacy[:MAX_SHOWN]
    if combined:
        attributes[names.ATTR_ASD_CONFIG] = combined[:MAX_SHOWN]
        attributes[names.ATTR_ASD_CHECKSUM] = combined_on and config.get("with_checksum") == "true"
    return attributes


__all__ = ["asd_attributes", "asd_config"]
