"""Every read of an OpenTelemetry SDK private attribute, in one place.

otel-train reuses parts of the SDK that have no public accessor: the OTLP exporters'
resolved settings (endpoint, headers, TLS, timeout, compression: they read every
``OTEL_EXPORTER_OTLP_*`` variable, which otel-train does not re-implement), the gRPC channel
and the HTTP client's single-request path (to send once, without the SDK's retry loop), a
``TracerProvider``'s span processors (to find where an application exports) and a
``ParentBased`` sampler's root. Those are private names and may move in any SDK release, so
they are read here only, each through a function that **raises**
:class:`SdkPrivateMismatch` (naming the class, the attribute and the supported versions) when
an SDK object lacks it, instead of quietly taking a slower or different path.
:func:`check_sdk` runs every read against the installed SDK's own objects
(``tests/common/test_sdk_private.py``), and ``pyproject.toml`` bounds ``opentelemetry-*`` to
the versions checked (:data:`SUPPORTED_SDK`).

One read is version-dependent by design: the OTLP/HTTP exporter's client (``_client`` with
``_submit``, ``_compress``, ``_transport``) exists from 1.45 (:data:`HTTP_CLIENT_SINCE`);
before it :func:`http_client` returns None and the exporter uses the SDK's own ``export()``
(it retries inside, so a send is not one attempt). From 1.45 on, a missing client is a
mismatch like any other.

Usage::

    check_sdk()                                   # raises SdkPrivateMismatch
    endpoint = otlp_endpoint(sdk_exporter)
    client = http_client(sdk_exporter)            # None before 1.45
"""

from __future__ import annotations

import functools
import io
from importlib import metadata
from typing import Any

# pyproject.toml's bound: check_sdk passes on 1.40.0, 1.43.0, 1.44.0 and 1.45.2; on 1.39.1
# the gRPC exporter has neither ``_initialize_channel_and_stub`` nor ``_insecure``.
SUPPORTED_SDK = ">=1.40,<1.46"
HTTP_CLIENT_SINCE = (1, 45)  # 1.44.0's OTLP/HTTP exporter has no ``_client``; 1.45.2's has
# What the single-attempt gRPC exporter uses, checked as it is built.
_GRPC_READS = ("_endpoint", "_headers", "_timeout", "_channel",
               "_initialize_channel_and_stub", "_shutdown")
# An application's gRPC exporter's settings, read to send where it sends.
_GRPC_SETTINGS = ("_endpoint", "_insecure", "_credentials", "_headers", "_timeout",
                  "_compression")
_HTTP_READS = ("_endpoint", "_compression")
_HTTP_CLIENT_READS = ("_timeout", "_submit", "_compress", "_transport")


class SdkPrivateMismatch(RuntimeError):
    """The installed OpenTelemetry SDK lacks a private attribute otel-train reads."""


@functools.lru_cache(maxsize=None)
def installed_version(distribution: str = "opentelemetry-sdk") -> tuple[int, ...]:
    """The installed version of an ``opentelemetry-*`` distribution as numbers (() unknown)."""
    try:
        text = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return ()
    numbers = []
    for part in text.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)


def read(obj: Any, name: str) -> Any:
    """``obj.<name>``, an SDK private attribute; :class:`SdkPrivateMismatch` if absent."""
    try:
        return getattr(obj, name)
    except AttributeError:
        kind = type(obj)
        version = ".".join(map(str, installed_version())) or "unknown"
        raise SdkPrivateMismatch(
            f"{kind.__module__}.{kind.__qualname__} has no {name!r}: otel-train reads this "
            f"private attribute of the OpenTelemetry SDK, checked on opentelemetry-sdk "
            f"{SUPPORTED_SDK}; installed {version}. Install a supported version.") from None


def require(obj: Any, names: tuple[str, ...]) -> None:
    """Every one of ``names`` on ``obj``, else :class:`SdkPrivateMismatch` for the first."""
    for name in names:
        read(obj, name)


# -- OTLP exporters -----------------------------------------------------------------------

def otlp_endpoint(exporter: Any) -> str:
    """Where an SDK OTLP span exporter sends (its resolved endpoint)."""
    return str(read(exporter, "_endpoint") or "")


def grpc_exporter_checked(exporter: Any) -> Any:
    """An SDK OTLP/gRPC span exporter, once every private read on it is known to work."""
    require(exporter, _GRPC_READS)
    return exporter


def grpc_settings(exporter: Any) -> dict[str, Any]:
    """An SDK OTLP/gRPC exporter's resolved settings, as its constructor's keywords."""
    return {name[1:]: read(exporter, name) for name in _GRPC_SETTINGS}


def grpc_timeout_seconds(exporter: Any) -> float:
    return float(read(exporter, "_timeout") or 10.0)


def grpc_channel(exporter: Any) -> Any:
    """The exporter's gRPC channel (None once closed)."""
    return read(exporter, "_channel")


def grpc_metadata(exporter: Any) -> Any:
    """The exporter's request metadata (its headers), or None."""
    return read(exporter, "_headers") or None


def grpc_renew_channel(exporter: Any) -> Any:
    """Make the exporter a fresh channel and stub; returns the old channel."""
    old = read(exporter, "_channel")
    read(exporter, "_initialize_channel_and_stub")()
    return old


def grpc_mark_shut_down(exporter: Any) -> None:
    """Tell the SDK exporter it is shut down (its channel is closed by the caller)."""
    read(exporter, "_shutdown")
    exporter._shutdown = True


def http_compression(exporter: Any) -> Any:
    return read(exporter, "_compression")


def http_client(exporter: Any) -> Any:
    """An SDK OTLP/HTTP exporter's client (its headers, TLS, session, timeout); None on an
    exporter older than :data:`HTTP_CLIENT_SINCE`, which has none."""
    version = installed_version("opentelemetry-exporter-otlp-proto-http")
    if version and version[:2] < HTTP_CLIENT_SINCE:
        return None
    client = read(exporter, "_client")
    require(client, _HTTP_CLIENT_READS)
    return client


def use_http_client(exporter: Any, client: Any) -> None:
    """Make ``client`` (another exporter's) the one ``exporter`` holds."""
    read(exporter, "_client")
    exporter._client = client


def http_client_timeout_seconds(client: Any) -> float:
    return float(read(client, "_timeout") or 0.0)


def http_send_once(client: Any, body: bytes, timeout_seconds: float) -> Any:
    """POST an encoded request once through the client (compressed as it is configured);
    the transport's result (``status_code``, or ``error``)."""
    return client._submit(client._compress(body), timeout_seconds)


def http_transport(client: Any) -> Any:
    return read(client, "_transport")


def set_http_transport(client: Any, transport: Any) -> None:
    read(client, "_transport")
    client._transport = transport


def urllib3_transport_class() -> Any:
    """The SDK's urllib3 HTTP transport class, or None when its package is not installed."""
    try:
        from opentelemetry.exporter.http.transport import _urllib3
    except ModuleNotFoundError:
        return None
    return read(_urllib3, "Urllib3HTTPTransport")


def metric_reader_shutdown_event(reader: Any) -> Any:
    """The ``threading.Event`` a ``PeriodicExportingMetricReader``'s thread waits on: set, the
    thread stops (a forked child's copy must not export)."""
    return read(reader, "_shutdown_event")


# -- Finished spans ---------------------------------------------------------------------------

_SPAN_READS = ("_attributes", "_context", "_name", "_parent", "_start_time", "_end_time")


#: The attribute a finished span holds its attributes in: what ``span_attributes`` reads.
#: The derived processors' per-step loops read it inline (``getattr(span,
#: SPAN_ATTRIBUTES_FIELD, None)``, one builtin call a step, not a Python call more), so
#: its name is still known here only.
SPAN_ATTRIBUTES_FIELD = "_attributes"


def span_attributes(span: Any) -> Any:
    """A finished span's attributes as held (``_attributes``): a plain dict on otel-train's
    spans (a record's ``RowRoot`` too), the SDK's read-only mapping on others; None for an
    object without."""
    return getattr(span, SPAN_ATTRIBUTES_FIELD, None)


def replace_span_attributes(span: Any, attributes: dict[str, Any]) -> None:
    """Give a finished span a new attribute dict (for the exporters that run after)."""
    span._attributes = attributes


def readable_span_fields(span: Any) -> tuple[Any, Any, str, Any, int, int]:
    """(attributes, context, name, parent, start_ns, end_ns) of a finished span: an SDK
    ``ReadableSpan``'s fields read directly (every span of every step passes here in the
    background; its properties cost a call each), another span's through the public API."""
    try:
        start = span._start_time or 0
        return (span._attributes, span._context, span._name, span._parent, start,
                span._end_time or start)
    except AttributeError:  # not an SDK ReadableSpan: the public API
        start = span.start_time or 0
        return (span.attributes, span.context, span.name, span.parent, start,
                span.end_time or start)


# -- Tracer providers and samplers ---------------------------------------------------------

def active_span_processor(provider: Any) -> Any:
    """An SDK ``TracerProvider``'s span processor (a multi-processor); None for another kind
    of provider."""
    from opentelemetry.sdk.trace import TracerProvider

    if not isinstance(provider, TracerProvider):
        return None
    return read(provider, "_active_span_processor")


def inner_span_processors(processor: Any) -> Any:
    """The processors inside an SDK multi-processor (or a look-alike that holds them the same
    way); None for a processor that holds none."""
    from opentelemetry.sdk.trace import ConcurrentMultiSpanProcessor, SynchronousMultiSpanProcessor

    if isinstance(processor, (SynchronousMultiSpanProcessor, ConcurrentMultiSpanProcessor)):
        return read(processor, "_span_processors")
    return getattr(processor, "_span_processors", None)


def parent_based_root(sampler: Any) -> Any:
    """The root sampler of a ``ParentBased`` sampler."""
    return read(sampler, "_root")


def check_sdk() -> list[str]:
    """Run every read above against the installed SDK's own objects; the names checked.
    Raises :class:`SdkPrivateMismatch` for the first one missing."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcExporter,
    )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.trace import SynchronousMultiSpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

    checked = []
    grpc = GrpcExporter(endpoint="http://127.0.0.1:4317", insecure=True)
    try:
        grpc_exporter_checked(grpc)
        grpc_settings(grpc)
        checked += [f"grpc exporter {n}" for n in dict.fromkeys(_GRPC_READS + _GRPC_SETTINGS)]
    finally:
        grpc.shutdown()
    http = HttpExporter(endpoint="http://127.0.0.1:4318/v1/traces")
    try:
        require(http, _HTTP_READS)
        checked += [f"http exporter {n}" for n in _HTTP_READS]
        if http_client(http) is not None:
            checked += ["http exporter _client"] + [f"http client {n}"
                                                    for n in _HTTP_CLIENT_READS]
        if urllib3_transport_class() is not None:
            checked.append("urllib3 transport")
    finally:
        http.shutdown()
    provider = TracerProvider()
    multi = active_span_processor(provider)
    if inner_span_processors(multi) is None:
        raise SdkPrivateMismatch("the TracerProvider's span processor holds no processors")
    inner_span_processors(SynchronousMultiSpanProcessor())
    checked += ["provider _active_span_processor", "multi-processor _span_processors"]
    if parent_based_root(ParentBased(ALWAYS_ON)) is not ALWAYS_ON:
        raise SdkPrivateMismatch("ParentBased._root is not the root sampler")
    checked.append("ParentBased _root")
    with provider.get_tracer("otel-train-check").start_as_current_span("check") as span:
        pass
    require(span, _SPAN_READS)
    checked += [f"span {n}" for n in _SPAN_READS]
    provider.shutdown()
    reader = PeriodicExportingMetricReader(ConsoleMetricExporter(out=io.StringIO()),
                                           export_interval_millis=3_600_000)
    reader.collect = lambda *args, **kwargs: None  # type: ignore[method-assign]  # unregistered
    try:
        metric_reader_shutdown_event(reader)
        checked.append("periodic metric reader _shutdown_event")
    finally:
        reader.shutdown()
    return checked
