"""Wiring to the OpenTelemetry SDK: resource, sampler, exporter choice, global provider.

The standard ``OTEL_*`` variables are honoured as the SDK documents them (service name,
resource attributes, OTLP endpoint/protocol/headers/timeout, sampler, ``OTEL_SDK_DISABLED``,
``OTEL_TRACES_EXPORTER``). A malformed value warns once and falls back to the default
instead of failing a training run at start-up.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.sampling import Sampler, _get_from_env_or_default

from otel_train.common.options import RunOptions
from otel_train.common.otlp_endpoint import warn_endpoint
from otel_train.common.rate_limited_log import warn_once

_DEFAULT_TIMEOUT_SECONDS = 10.0
# gRPC's default receive limit on a collector; requests are split to stay under it.
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024


def _bool_env(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return False
    low = raw.strip().lower()
    if low in ("true", "1"):
        return True
    if low not in ("false", "0"):
        warn_once(name, "otel-train: %s=%r is not true/false; using false", name, raw)
    return False


def sdk_disabled(env: Mapping[str, str] | None = None) -> bool:
    """``OTEL_SDK_DISABLED``, read as the SDK reads it."""
    return _bool_env(os.environ if env is None else env, "OTEL_SDK_DISABLED")


@dataclass(frozen=True)
class ExportPlan:
    """Which exporter a run uses and why (printed once at start)."""

    kind: str  # otlp | jsonl | console | none
    protocol: str | None = None
    endpoint: str | None = None
    path: Path | None = None
    timeout_seconds: float = _DEFAULT_TIMEOUT_SECONDS
    # OTLP/HTTP: a generic endpoint (option or OTEL_EXPORTER_OTLP_ENDPOINT) gets /v1/traces
    # appended; OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is used exactly as given (the spec).
    endpoint_is_signal_specific: bool = False
    # The local span file (kind 'jsonl'): OTLP JSON lines, rotated and capped.
    max_file_bytes: int = 256 * 1024 * 1024
    max_total_bytes: int | None = None
    compression: str = "none"

    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    # Names (never values) of the OTLP headers configured through the environment.
    header_names: tuple[str, ...] = ()
    # The exporter process's pid when export runs there (export/process/).
    process_pid: int | None = None

    def describe(self) -> str:
        """One line for the start-up banner (credentials shown as ``***``, never printed)."""
        text = self._describe()
        if self.process_pid is not None:
            text += f" (exporter process pid {self.process_pid})"
        return text

    def _describe(self) -> str:
        if self.kind == "otlp":
            where = redact_url(self.endpoint) if self.endpoint else "(SDK default endpoint)"
            text = f"OTLP {self.protocol} -> {where}"
            if self.header_names:
                text += f" (headers: {', '.join(f'{n}=***' for n in self.header_names)})"
            return text
        if self.kind == "jsonl":
            return f"span file {self.path} (OTLP JSON lines)"
        return self.kind


def redact_url(url: str) -> str:
    """``url`` with its userinfo and query values replaced by ``***`` (for banners and logs)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "***"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = "&".join(f"{q.split('=', 1)[0]}=***" if "=" in q else "***"
                     for q in parts.query.split("&")) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def url_secrets(url: str | None) -> list[str]:
    """The secret parts of ``url`` (password, user, query values), to scrub from messages."""
    if not url:
        return []
    try:
        parts = urlsplit(url)
    except ValueError:
        return [url]
    found = [parts.password or "", parts.username or ""]
    found += [q.split("=", 1)[1] for q in parts.query.split("&") if "=" in q]
    return [s for s in found if s]


def _otlp_header_env(env: Mapping[str, str]) -> str:
    return env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or env.get("OTEL_EXPORTER_OTLP_HEADERS",
                                                                     "")


def _header_names_and_values(env: Mapping[str, str]) -> tuple[tuple[str, ...], list[str]]:
    from opentelemetry.util.re import parse_env_headers

    raw = _otlp_header_env(env)
    if not raw.strip():
        return (), []
    try:
        headers = parse_env_headers(raw, liberal=True)
    except Exception:
        return ("(unparsable)",), [raw]
    values = [v for v in headers.values() if v]
    # The raw text too: a value the parser mangled must still be scrubbed.
    values += [part.split("=", 1)[1].strip() for part in raw.split(",") if "=" in part]
    return tuple(headers), [v for v in values if v]


def plan_export(options: RunOptions, status_dir: Path, rank: int, world_size: int,
                env: Mapping[str, str] | None = None) -> ExportPlan:
    """Decide the exporter from the options and the OTEL_* environment."""
    env = os.environ if env is None else env
    if sdk_disabled(env):
        return ExportPlan("none")
    kind = options.exporter
    if kind is None:
        raw = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
        names = [n.strip() for n in raw.split(",") if n.strip()]
        known = {"otlp", "console", "none", "jsonl"}
        if names and all(n in known for n in names):
            kind = names[0]
            if len(names) > 1:
                warn_once("exporters", "otel-train: OTEL_TRACES_EXPORTER=%r: using %r only",
                          raw, kind)
        elif names:
            warn_once("OTEL_TRACES_EXPORTER",
                      "otel-train: OTEL_TRACES_EXPORTER=%r is not one of otlp, console, none, "
                      "jsonl; using the default", raw)
    specific = not options.otlp_endpoint and bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
    endpoint = options.otlp_endpoint or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT")
    if kind in (None, "auto"):
        kind = "otlp" if endpoint else "jsonl"
    if kind == "otlp":
        protocol = _protocol(options, env)
        if endpoint:  # checked, said once, never fatal (otlp_endpoint.py)
            source = ("otlp_endpoint" if options.otlp_endpoint else
                      "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" if specific
                      else "OTEL_EXPORTER_OTLP_ENDPOINT")
            warn_endpoint(source, endpoint, protocol, env)
        return ExportPlan("otlp", protocol, endpoint or None,
                          timeout_seconds=_timeout(env), endpoint_is_signal_specific=specific,
                          max_request_bytes=getattr(options, "export_max_request_bytes",
                                                    DEFAULT_MAX_REQUEST_BYTES),
                          header_names=_header_names_and_values(env)[0])
    if kind == "jsonl":
        if options.spans_path:
            path = Path(options.spans_path)
        else:
            name = "spans.jsonl" if world_size == 1 else f"spans-rank{rank}.jsonl"
            path = status_dir / name
        compression = options.spans_compression
        if options.spans_path and "spans_compression" not in options.sources:
            # A path the user named is used as named: its suffix says whether it is gzip.
            compression = "gzip" if path.name.endswith(".gz") else "none"
        if compression == "gzip" and not path.name.endswith(".gz"):
            path = path.with_name(path.name + ".gz")
        return ExportPlan("jsonl", path=path, max_file_bytes=options.spans_file_max_bytes,
                          max_total_bytes=options.spans_total_max_bytes,
                          compression=compression)
    return ExportPlan(kind)


def _protocol(options: RunOptions, env: Mapping[str, str]) -> str:
    if options.otlp_protocol:
        return options.otlp_protocol
    for var in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        raw = env.get(var, "").strip()
        if not raw:
            continue
        if raw in ("grpc", "http/protobuf"):
            return raw
        warn_once(var, "otel-train: %s=%r is not supported (grpc, http/protobuf); using "
                  "http/protobuf", var, raw)
        return "http/protobuf"
    return "http/protobuf"  # the OTLP specification's default


def _timeout(env: Mapping[str, str]) -> float:
    for var in ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"):
        raw = env.get(var, "").strip()
        if not raw:
            continue
        try:
            value = float(raw)
            if value > 0:
                # Seconds, as the Python SDK's OTLP exporters read it (the spec says
                # milliseconds; we follow the SDK the user configures against).
                return value
        except ValueError:
            pass
        warn_once(var, "otel-train: %s=%r is not a positive number; using %.0f s", var, raw,
                  _DEFAULT_TIMEOUT_SECONDS)
        return _DEFAULT_TIMEOUT_SECONDS
    return _DEFAULT_TIMEOUT_SECONDS


def build_resource(service_name: str | None, identity_attrs: Mapping[str, Any],
                   env: Mapping[str, str] | None = None) -> Resource:
    """Resource from OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME, the option winning."""
    env = os.environ if env is None else env
    attrs: dict[str, Any] = dict(identity_attrs)
    if service_name:
        attrs["service.name"] = service_name
    elif not env.get("OTEL_SERVICE_NAME") and "service.name=" not in env.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""):
        attrs["service.name"] = "otel-train"
    return Resource.create(attrs)


def build_sampler() -> Sampler:
    """The sampler OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG describe (SDK rules)."""
    return _get_from_env_or_default()
