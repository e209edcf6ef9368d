"""The OTLP endpoint checked at start-up, by the rules the OTel SDK's exporters apply to it.

A run whose endpoint cannot work still trains: the problem is said once, in one line naming
where the endpoint came from (the ``otlp_endpoint`` option, ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), its value and what is wrong, and spans queue and are
counted as the collector being away would leave them.

The SDK's rules:

- ``http/protobuf``: the endpoint is a URL, ``http://`` or ``https://``, with a host (the
  exporter posts to it with ``requests``; ``not-a-url`` fails every request);
- ``grpc``: ``http://host:port`` (plaintext), ``https://host:port`` (TLS), or ``host:port``
  alone; with a scheme, the exporter keeps only the URL's ``host:port``, and it uses TLS for
  any scheme other than ``http`` and for ``host:port`` alone, unless
  ``OTEL_EXPORTER_OTLP_INSECURE=true``; gRPC target names (``unix:/path``,
  ``dns:///host:port``) go to the channel as given.

Beyond what breaks, a hint for a port that belongs to the other protocol: 4317 is OTLP/gRPC's,
4318 OTLP/HTTP's, and a collector's gRPC port rejects HTTP requests (and the other way round).

Usage::

    problem = endpoint_problem("not-a-url", "http/protobuf")
    # 'it is not a URL: http/protobuf sends to http://host:4318 or https://host:4318'
    hint = endpoint_hint("http://127.0.0.1:4317", "http/protobuf", env)
    warn_endpoint("OTEL_EXPORTER_OTLP_ENDPOINT", "not-a-url", "http/protobuf", env)
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from otel_train.common.rate_limited_log import warn_once

GRPC_PORT = 4317
HTTP_PORT = 4318
_SCHEMES = ("http", "https")
# gRPC's own target names, which the SDK passes to the channel as they are.
_GRPC_RESOLVERS = frozenset(("unix", "unix-abstract", "dns", "ipv4", "ipv6", "vsock"))


def _example(protocol: str) -> str:
    if protocol == "grpc":
        return f"http://host:{GRPC_PORT} (plaintext), https://host:{GRPC_PORT} or host:port"
    return f"http://host:{HTTP_PORT} or https://host:{HTTP_PORT}"


def _port_problem(port_text: str) -> str | None:
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return f"its port {port_text!r} is not a number from 1 to 65535"
    return None


def _host_port(endpoint: str) -> tuple[str, str | None]:
    """host and port text of a URL's or a gRPC target's authority (port None: not given)."""
    authority = endpoint.split("://", 1)[1] if "://" in endpoint else endpoint
    authority = authority.split("/", 1)[0].rsplit("@", 1)[-1]
    if authority.startswith("["):  # [::1]:4317
        host, _, rest = authority[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else None
    if authority.count(":") == 1:
        host, port = authority.split(":")
        return host, port
    return authority, None


def endpoint_problem(endpoint: str, protocol: str) -> str | None:
    """What makes ``endpoint`` unusable with ``protocol`` ('grpc' or 'http/protobuf'), in
    words; None when the SDK can use it."""
    text = endpoint.strip()
    if not text:
        return "it is empty"
    if any(c.isspace() for c in text):
        return "it holds spaces"
    if protocol == "grpc" and text.split(":", 1)[0].lower() in _GRPC_RESOLVERS:
        return None  # a gRPC target name (unix:/path, dns:///host:port): passed on as given
    if "://" not in text:
        if protocol != "grpc":
            return f"it is not a URL: {protocol} sends to {_example(protocol)}"
        host, port = _host_port(text)
        if port is None:
            return f"it names no port: gRPC sends to {_example(protocol)}"
        if not host:
            return "it names no host"
        return _port_problem(port)
    scheme = urlsplit(text).scheme.lower()
    if scheme not in _SCHEMES and protocol != "grpc":  # (gRPC: a hint, it takes host:port)
        return (f"its scheme {scheme + '://'!r} is not http:// or https://: {protocol} sends "
                f"to {_example(protocol)}")
    host, port = _host_port(text)
    if not host:
        return "it names no host"
    return _port_problem(port) if port is not None else None


def endpoint_hint(endpoint: str, protocol: str, env: Mapping[str, str]) -> str | None:
    """A usable endpoint that most likely does not do what was meant: the other protocol's
    port, or a gRPC ``host:port`` that will use TLS. None when nothing stands out."""
    text = endpoint.strip()
    if protocol == "grpc" and text.split(":", 1)[0].lower() in _GRPC_RESOLVERS:
        return None
    _, port = _host_port(text)
    if protocol != "grpc" and port == str(GRPC_PORT):
        return (f"port {GRPC_PORT} is OTLP/gRPC's, and the protocol is {protocol}: a "
                f"collector listens for it on {HTTP_PORT} (or set "
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc)")
    if protocol == "grpc" and port == str(HTTP_PORT):
        return (f"port {HTTP_PORT} is OTLP/HTTP's, and the protocol is grpc: a collector "
                f"listens for it on {GRPC_PORT} (or set OTEL_EXPORTER_OTLP_PROTOCOL="
                "http/protobuf)")
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    if protocol == "grpc" and scheme and scheme not in _SCHEMES:
        return (f"the gRPC exporter keeps only host:port of a {scheme}:// URL and connects "
                "with TLS, as for https://; write http:// for a plaintext collector")
    if (protocol == "grpc" and "://" not in text
            and env.get("OTEL_EXPORTER_OTLP_INSECURE", "").strip().lower() != "true"):
        return ("without a scheme the gRPC exporter connects with TLS; write http://" + text
                + " for a plaintext collector (or set OTEL_EXPORTER_OTLP_INSECURE=true)")
    return None


def warn_endpoint(source: str, endpoint: str, protocol: str,
                  env: Mapping[str, str]) -> str | None:
    """Say once, in one line, what is wrong with the endpoint (or what stands out about
    it); the line, or None when there was nothing to say."""
    problem = endpoint_problem(endpoint, protocol)
    if problem is not None:
        line = (f"otel-train: {source}={endpoint!r} is not a usable OTLP {protocol} endpoint: "
                f"{problem}; training goes on, its spans will not reach a collector")
    else:
        hint = endpoint_hint(endpoint, protocol, env)
        if hint is None:
            return None
        line = f"otel-train: {source}={endpoint!r}: {hint}"
    warn_once(f"otlp-endpoint:{source}:{endpoint}:{protocol}", "%s", line)
    return line
