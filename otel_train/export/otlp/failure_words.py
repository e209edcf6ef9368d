"""Why an OTLP send failed, in words a user acts on, not exception class names.

The transports (``transport.py``) get an exception from ``requests``/``urllib3`` or a gRPC
status code and its details; what the warning says is what happened at the collector's end:
it refused the connection, its name did not resolve, the endpoint is not a URL, it answered
HTTP 404, no answer came in time. An unreachable collector and a malformed endpoint read
differently. Anything not recognised is given by its message (never its class), cut short.

Usage::

    http_error_words(exc)                 # 'the collector refused the connection'
    http_status_words(404)                # 'the collector answered HTTP 404: nothing ...'
    grpc_error_words("UNAVAILABLE", "failed to connect to all addresses; ...")
"""

from __future__ import annotations

from typing import Any

REFUSED = "the collector refused the connection (nothing listens on that port)"
NOT_RESOLVED = "its host name could not be resolved"
NOT_A_URL = "the endpoint is not a usable URL (http://host:port or https://host:port)"
NO_ANSWER = "no answer within the export timeout"
CONNECT_TIMEOUT = "the connection timed out (is the host reachable?)"
TLS_FAILED = "the TLS handshake failed (a plaintext collector takes http://)"
_MAX_MESSAGE_CHARS = 200

_URL_ERRORS = frozenset(("MissingSchema", "InvalidSchema", "InvalidURL", "LocationParseError",
                         "URLSchemeUnknown", "LocationValueError"))
_CLOSED = ("the connection closed without an answer (is that an OTLP/HTTP port? gRPC listens "
           "on 4317, HTTP on 4318)")
# Words in a message that say the same when the class does not.
_MESSAGES = (
    (("Connection refused", "ECONNREFUSED", "actively refused"), REFUSED),
    (("Name or service not known", "nodename nor servname", "getaddrinfo",
      "Temporary failure in name resolution", "DNS resolution failed",
      "Failed to resolve", "No address associated", "errors resolving",
      "Domain name not found", "hostname lookup error"), NOT_RESOLVED),
    (("No route to host", "Network is unreachable", "EHOSTUNREACH", "ENETUNREACH"),
     "no route to the collector's host (network unreachable)"),
    (("SSL", "handshake", "certificate"), TLS_FAILED),
    (("timed out", "Timeout occurred", "Deadline Exceeded"), CONNECT_TIMEOUT),
)
_HTTP_STATUS = {
    400: "the collector rejected the request as malformed",
    401: "the collector asks for credentials (OTEL_EXPORTER_OTLP_HEADERS)",
    403: "the collector refused the credentials",
    404: "nothing answers at that path (OTLP/HTTP takes /v1/traces; is it the collector's "
         "HTTP port, 4318?)",
    405: "that path does not take a POST (is it the collector's OTLP/HTTP endpoint?)",
    413: "the request was too large for the collector",
    415: "the collector does not take protobuf there",
    429: "the collector asks to slow down",
    502: "a proxy in front of the collector could not reach it",
    503: "the collector is unavailable for now",
    504: "a proxy in front of the collector got no answer in time",
}
_GRPC_CODES = {
    "DEADLINE_EXCEEDED": NO_ANSWER,
    "CANCELLED": "the request was cancelled before an answer came",
    "UNIMPLEMENTED": "the server there has no OTLP trace service (is it the collector's gRPC "
                     "port, 4317?)",
    "UNAUTHENTICATED": "the collector asks for credentials (OTEL_EXPORTER_OTLP_HEADERS)",
    "PERMISSION_DENIED": "the collector refused the credentials",
    "RESOURCE_EXHAUSTED": "the collector is out of resources for now",
    "INVALID_ARGUMENT": "the collector rejected the request as malformed",
    "INTERNAL": "the collector failed on the request (INTERNAL)",
}


def _message(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[:_MAX_MESSAGE_CHARS - 3] + "..."


def _by_message(text: str) -> str | None:
    for needles, words in _MESSAGES:
        if any(n.lower() in text.lower() for n in needles):
            return words
    return None


def http_error_words(error: Any) -> str:
    """What an exception raised by an OTLP/HTTP send means (urllib3's wrapper unwrapped)."""
    error = getattr(error, "reason", None) or error  # MaxRetryError: its cause
    name = type(error).__name__
    names = {cls.__name__ for cls in type(error).__mro__}
    text = str(error)
    if names & _URL_ERRORS:
        return NOT_A_URL
    if "NameResolutionError" in names:
        return NOT_RESOLVED
    # By the class itself: urllib3's NewConnectionError descends from its timeout classes.
    if name in ("ReadTimeout", "ReadTimeoutError"):
        return NO_ANSWER
    if name in ("ConnectTimeout", "ConnectTimeoutError"):
        return CONNECT_TIMEOUT
    if "SSLError" in names:
        return TLS_FAILED
    by_text = _by_message(text)
    if by_text is not None:
        return by_text
    if names & {"ProtocolError", "RemoteDisconnected", "ConnectionResetError",
                "ChunkedEncodingError", "BadStatusLine"}:
        return _CLOSED
    if names & {"NewConnectionError", "ConnectionError"}:
        return "no connection could be made to the collector"
    return f"it failed: {_message(text)}" if text.strip() else "it failed, with no detail"


def http_status_words(status: int) -> str:
    """An HTTP answer that is not a success, in words."""
    words = _HTTP_STATUS.get(status)
    return f"the collector answered HTTP {status}" + (f": {words}" if words else "")


def grpc_error_words(code_name: str | None, details: str) -> str:
    """A failed gRPC call (its status code's name and details) in words."""
    if code_name == "UNAVAILABLE" or code_name is None:
        by_text = _by_message(details)
        if by_text is not None:
            return by_text
        if any(t in details for t in ("Socket closed", "Connection reset", "GOAWAY",
                                      "Trying to connect an http1.x server")):
            return ("the connection closed without an answer (is that an OTLP/gRPC port? "
                    "gRPC listens on 4317, HTTP on 4318)")
        if "failed to connect" in details:
            return "no connection could be made to the collector"
        if code_name == "UNAVAILABLE":
            return "the collector is unavailable for now"
    words = _GRPC_CODES.get(code_name or "")
    if words is not None:
        return words
    return f"it failed ({code_name or 'no status'}: {_message(details)})"
