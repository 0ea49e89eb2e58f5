"""Gateway settings (the HTTP side of the CLI flags; the engine side is `runtime.EngineConfig`)."""

from __future__ import annotations

from msgspec import Struct, field


class Settings(Struct, kw_only=True):
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_names: list[str] = field(default_factory=list)  # extra ids accepted besides engine.model_name
    api_keys: list[str] = field(default_factory=list)  # empty: no authentication
    registry_dir: str | None = None  # None: ~/.cache/jumpgate/registry
    max_body_bytes: int = 4 * 1024 * 1024
    max_tokens_limit: int = 4096  # largest max_tokens a request may ask for
    max_n: int = 8
    max_concurrent_requests: int = 320  # gateway-side guard: in-flight generation requests
    retry_after_s: int = 1  # Retry-After on 503 overloaded
    grammar_compile_timeout_s: float = 30.0
    log_level: str = "info"
    # /v1/responses with store=true: per tenant, in a folder beside the registry (oldest dropped first)
    responses_max_stored: int = 1000
    responses_max_bytes: int = 64 * 1024 * 1024
    openapi: bool = True

    def validate(self) -> None:
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes: must be >= 1024")
        if self.max_tokens_limit < 1:
            raise ValueError("max_tokens_limit: must be >= 1")
        if self.max_n < 1:
            raise ValueError("max_n: must be >= 1")
        if self.max_concurrent_requests < 1:
            raise ValueError("max_concurrent_requests: must be >= 1")
        if self.responses_max_stored < 1:
            raise ValueError("responses_max_stored: must be >= 1")
        if self.responses_max_bytes < 1024:
            raise ValueError("responses_max_bytes: must be >= 1024")
