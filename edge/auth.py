"""Bearer-token authentication at the edge, as the OpenTelemetry Collector's bearertokenauth extension does
it: the client sends `authorization: Bearer <token>` (HTTP header or gRPC metadata), compared in constant time.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Callable

import grpc

# RFC 6750 section 3: a missing token gets the challenge alone, a wrong one says it is invalid.
CHALLENGE_MISSING = 'Bearer realm="sloscope"'
CHALLENGE_INVALID = 'Bearer realm="sloscope", error="invalid_token"'


@dataclass(frozen=True)
class BearerAuth:
    token: bytes
    open_paths: frozenset[str] = frozenset()  # GET pages anyone may read (the kubelet's probes)

    def check(self, authorization: str | None) -> str | None:
        """None where `authorization` (the header's value, untrusted) carries the token, else the challenge."""
        if not authorization:
            return CHALLENGE_MISSING
        scheme, _, credentials = authorization.strip().partition(" ")
        # compare_digest takes ASCII only; a token is ASCII, so anything else is simply wrong
        given = credentials.strip().encode() if credentials.isascii() else b""
        if scheme.lower() != "bearer" or not hmac.compare_digest(given, self.token):
            return CHALLENGE_INVALID
        return None


class BearerInterceptor(grpc.ServerInterceptor):
    """gRPC calls without the token end UNAUTHENTICATED before their message is decoded."""

    def __init__(self, auth: BearerAuth, count: Callable[[str], None]):
        self.auth = auth
        self.count = count

    def intercept_service(self, continuation, handler_call_details):
        metadata = dict(handler_call_details.invocation_metadata or ())
        if self.auth.check(metadata.get("authorization")) is None:
            return continuation(handler_call_details)
        self.count("unauthenticated_grpc")
        return _REFUSE


def _refuse(_requests, context):
    context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")


# A streaming handler, which does not wait for the message it refuses: a unary one held a thread until the call's
# message came, which a client that never sends it (or sends it slowly) could make last till its connection's end.
_REFUSE = grpc.stream_unary_rpc_method_handler(_refuse)
