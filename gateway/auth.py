"""Optional API keys. Each key is a tenant: its schemas and its KV-cache prefixes are its own
(the prefixes' namespace: gateway.pipeline.preparation.cache_namespace).

With no keys configured every request is the default tenant "". Keys are compared in constant time
(hmac.compare_digest against every configured key, so timing says nothing about which one matched).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from gateway.errors import unauthorized

DEFAULT_TENANT = ""


def tenant_id(api_key: str) -> str:
    """A short, stable, non-reversible id for a key (used in file names and cache namespaces)."""
    return "t" + hashlib.sha256(api_key.encode()).hexdigest()[:16]


class Authenticator:
    def __init__(self, api_keys: list[str] | tuple[str, ...] = ()):
        self._keys = [(k.encode(), tenant_id(k)) for k in api_keys if k]

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def tenant_for(self, headers: Any) -> str:
        """Return the request's tenant or raise a 401 APIError."""
        if not self._keys:
            return DEFAULT_TENANT
        presented = _presented_key(headers)
        if presented is None:
            raise unauthorized(
                "You didn't provide an API key. Provide it in the Authorization header (Authorization: Bearer KEY)."
            )
        candidate = presented.encode()
        match: str | None = None
        for key, tenant in self._keys:  # no early exit: every key is compared
            if hmac.compare_digest(candidate, key):
                match = tenant
        if match is None:
            raise unauthorized("Incorrect API key provided.")
        return match


def _presented_key(headers: Any) -> str | None:
    auth = headers.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return None
    key = headers.get("x-api-key") or headers.get("api-key")
    return key.strip() if key else None


# An in-process request the server makes itself (a Batch API line) names its tenant in its ASGI
# scope; HTTP clients cannot set scope keys, only headers.
INTERNAL_TENANT_SCOPE_KEY = "jumpgate.tenant"


def require_api_key(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Litestar guard: resolves the tenant (or raises 401) before the body is read."""
    internal = connection.scope.get(INTERNAL_TENANT_SCOPE_KEY)  # type: ignore[call-overload]
    if isinstance(internal, str):
        connection.state.tenant = internal
        return
    authenticator: Authenticator = connection.app.state.authenticator
    connection.state.tenant = authenticator.tenant_for(connection.headers)


def provide_tenant(request: Request[Any, Any, Any]) -> str:
    """Dependency: the tenant the guard resolved."""
    return getattr(request.state, "tenant", DEFAULT_TENANT)
