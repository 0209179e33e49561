"""Value rules of single keys (`check=` in a schema field): each raises `ConfigError` naming the key."""

from __future__ import annotations

import ipaddress
import os
import re
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from otel_mindformers.config.errors import ConfigError, suggestion
from otel_mindformers.config.limits import EXPORT_RANK_STRATEGIES, MAX_SECONDS, NOTIFIER_TYPES, SIGNED_NOTIFIER_TYPES


class _Notifier(Protocol):
    """What the notifier check reads of schema.NotifierConfig (which imports this module)."""

    type: str | None
    url: str | None
    secret: str | None


def _at_least(minimum: float, maximum: float | None = None) -> Callable[[str, Any], None]:
    def check(key: str, value: Any) -> None:
        if value is not None and value < minimum:
            raise ConfigError(f"{key}: must be >= {minimum}, got {value!r}")
        if value is not None and maximum is not None and value > maximum:
            raise ConfigError(f"{key}: must be <= {maximum}, got {value!r}")

    return check


def _seconds(minimum: float) -> Callable[[str, Any], None]:
    return _at_least(minimum, MAX_SECONDS)


def _one_of(allowed: tuple[str, ...]) -> Callable[[str, Any], None]:
    def check(key: str, value: Any) -> None:
        values = value if isinstance(value, list) else [value]
        for item in values:
            if item is not None and item not in allowed:
                hint = suggestion(item, allowed)
                raise ConfigError(f"{key}: unknown value {item!r}{hint}; allowed: {', '.join(allowed)}")

    return check


def _between(low: float, high: float) -> Callable[[str, Any], None]:
    def check(key: str, value: Any) -> None:
        if not low <= value <= high:
            raise ConfigError(f"{key}: must be between {low} and {high}, got {value!r}")

    return check


def _check_step_spans(key: str, value: Any) -> None:
    if not isinstance(value, bool) and value < 1:
        raise ConfigError(f"{key}: expected true, false or a step count >= 1, got {value!r}")


def _check_report_ranks(key: str, value: Any) -> None:
    if value == "all":
        return
    if not isinstance(value, list) or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in value):
        raise ConfigError(f"{key}: expected 'all' or a list of ranks >= 0, got {value!r}")


def _check_rank_strategy(key: str, value: Any) -> None:
    """`export_ranks.spans` / `.metrics`: a strategy's name, a list of ranks, or a fraction."""
    if isinstance(value, float):
        if not 0.0 < value < 1.0:
            raise ConfigError(
                f"{key}: a fraction of the ranks must be between 0 and 1 (both excluded), got {value!r}; "
                "write `all` for every rank"
            )
        return
    if isinstance(value, list):
        if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in value):
            raise ConfigError(f"{key}: a list of ranks holds ranks >= 0, got {value!r}")
        return
    if value not in EXPORT_RANK_STRATEGIES:
        hint = suggestion(value, EXPORT_RANK_STRATEGIES)
        raise ConfigError(
            f"{key}: unknown value {value!r}{hint}; expected {', '.join(EXPORT_RANK_STRATEGIES)}, "
            "a list of ranks, or a fraction of the ranks (0 < f < 1)"
        )


def _check_dotted_path(key: str, value: Any) -> None:
    if value is not None and ("." not in value or not all(part.isidentifier() for part in value.split("."))):
        raise ConfigError(f"{key}: expected 'module.ClassName', got {value!r}")


# Job ids become file names, attribute values and log text: keep them short and printable.
_MAX_JOB_ID_CHARS = 128


def job_id_problem(value: str) -> str | None:
    """What makes `value` unfit to name a job (None: nothing); the config's and the
    launcher variables' job ids alike (job/identity.py)."""
    if not value.strip():
        return f"must name a job, got {value!r}"
    if len(value) > _MAX_JOB_ID_CHARS:
        return f"at most {_MAX_JOB_ID_CHARS} characters, got {len(value)}"
    if not value.isprintable():
        return f"contains a control character: {value[:_MAX_JOB_ID_CHARS]!r}"
    return None


def _check_job_id(key: str, value: Any) -> None:
    problem = None if value is None else job_id_problem(value)
    if problem is not None:
        raise ConfigError(f"{key}: {problem}")


def _check_output_path(key: str, value: Any) -> None:
    """What can be told of a path without the file system (that is checked at run start)."""
    if not value.strip():
        raise ConfigError(f"{key}: must name a path, got {value!r}")
    if "\0" in value:
        raise ConfigError(f"{key}: contains a NUL character")


def _check_file_path(key: str, value: Any) -> None:
    _check_output_path(key, value)
    if value.endswith(("/", os.sep)) or Path(value).name in ("", ".", ".."):
        raise ConfigError(f"{key}: must name a file, got the directory {value!r}")


_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def _check_host(key: str, value: Any) -> None:
    """An IP address or a host name (RFC 1123); resolving it is left to `validate`."""
    try:
        ipaddress.ip_address(value)
        return
    except ValueError:
        pass
    if len(value) > 253 or not all(_HOST_LABEL.match(label) for label in value.rstrip(".").split(".")):
        raise ConfigError(f"{key}: expected an IP address or a host name, got {value!r}")


def _url_problem(url: str, schemes: tuple[str, ...]) -> str | None:
    """Why `url` cannot be used (None: it can). Never quotes the URL."""
    if any(ch.isspace() for ch in url):
        return "contains whitespace"
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # raises on a port out of range or not a number
    except ValueError as exc:
        return f"does not parse as a URL ({str(exc).split(':')[0]})"
    if parts.scheme not in schemes:
        return f"expected an {' or '.join(s + '://' for s in schemes)} URL"
    if not parts.hostname:
        return "the URL names no host"
    return None


def _check_endpoint(key: str, value: Any) -> None:
    """`http(s)://host:port[/path]`, or `host:port` (gRPC); credentials in it stay unprinted."""
    if value is None:
        return
    url = value if "://" in value else f"http://{value}"
    problem = _url_problem(url, ("http", "https"))
    if problem:
        raise ConfigError(f"{key}: {problem} (value not shown)")


# Header names are HTTP tokens; values must not carry line breaks (they would end the header).
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


def _check_headers(key: str, headers: dict[str, str]) -> None:
    for name, value in headers.items():
        if not _HEADER_NAME.match(name):
            raise ConfigError(f"{key}: {name!r} is not a valid header name")
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
            raise ConfigError(f"{key}.{name}: contains a control character such as a line break (value not shown)")


def _check_notifiers(key: str, notifiers: list[_Notifier]) -> None:
    # URLs and secrets carry tokens: messages name the key, never the value.
    problems = []
    for index, notifier in enumerate(notifiers):
        item = f"{key}[{index}]"
        if notifier.type is None:
            problems.append(f"{item}.type: required; one of {', '.join(NOTIFIER_TYPES)}")
        if not notifier.url:
            problems.append(f"{item}.url: required for a {notifier.type!r} notifier")
        else:
            problem = _url_problem(notifier.url, ("http", "https"))
            if problem:
                problems.append(f"{item}.url: {problem} (value not shown)")
        if notifier.secret is not None and any(ch.isspace() for ch in notifier.secret):
            problems.append(f"{item}.secret: contains whitespace (value not shown)")
        if notifier.secret is not None and notifier.type not in SIGNED_NOTIFIER_TYPES:
            problems.append(
                f"{item}.secret: {notifier.type!r} notifiers do not sign requests; "
                f"a secret is used by {', '.join(SIGNED_NOTIFIER_TYPES)}"
            )
    if problems:
        raise ConfigError(*problems)


def _check_server(key: str, value: Any) -> None:
    """ClusterD's gRPC address: `host` or `host:port` (no scheme: it speaks plain gRPC)."""
    if value is None:
        return
    host, port = split_host_port(value)
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        raise ConfigError(f"{key}: the port of {value!r} is not a number from 1 to 65535")
    _check_host(key, host)


def split_host_port(address: str) -> tuple[str, str | None]:
    """`host`, `host:port`, `[v6]` or `[v6]:port` -> (host, port or None); a bare IPv6 address is a host."""
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        return host, (rest[1:] if rest.startswith(":") else rest) if rest else None
    if address.count(":") == 1:
        host, port = address.split(":")
        return host, port
    return address, None


# MindCluster's public fault codes: nine digits (its fault-code rules: type, default level,
# two reserved digits, 1 for a user-defined code, four digits of the code).
_PUBLIC_FAULT_CODE = re.compile(r"^\d{9}$")


def _check_public_fault_code(key: str, value: Any) -> None:
    if not _PUBLIC_FAULT_CODE.match(value):
        raise ConfigError(f"{key}: a public fault code is nine digits (e.g. 010011001), got {value!r}")


# ClusterD's checks (component/clusterd/pkg/application/publicfault/checker.go): the sender
# is a name its configuration allows; a node name is a Kubernetes node name.
_RESOURCE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
NODE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-.]{0,251}[a-z0-9])?$")


def _check_resource(key: str, value: Any) -> None:
    if not _RESOURCE.match(value):
        raise ConfigError(f"{key}: letters, digits, '-', '_' and '.', at most 64, got {value!r}")


def _check_node_name(key: str, value: Any) -> None:
    if value is not None and not NODE_NAME.match(value):
        raise ConfigError(
            f"{key}: a Kubernetes node name (lower-case letters, digits, '-' and '.', as "
            f"`kubectl get nodes` lists it), got {value!r}"
        )
