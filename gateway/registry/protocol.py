"""The schema registry's request and answer bodies: an upload, a check (POST /v1/schemas/check), lists
(a stored entry, `SchemaEntry`, is the store's own record: gateway/pipeline/schema_registry.py)."""

from __future__ import annotations

from typing import Any, Literal

from msgspec import Struct

from gateway.pipeline.schema_registry import SchemaEntry
from gateway.protocol import SchemaMode, ToolDefinition


class SchemaUpload(Struct, kw_only=True):
    """POST /v1/schemas: exactly one of `schema` (JSON schema), `regex`, `ebnf`, `tools`."""

    name: str | None = None
    schema: dict[str, Any] | None = None
    regex: str | None = None
    ebnf: str | None = None
    tools: list[ToolDefinition] | None = None
    # keep this schema's prompt prefix (system_prompt + schema text) resident in the KV cache
    pin: bool = False
    system_prompt: str | None = None  # the system prompt that requests using this schema send (for the pin)
    schema_mode: SchemaMode | None = None  # best_effort: register a schema whose keywords are not all enforced


class SchemaCheckRequest(Struct, kw_only=True):
    """POST /v1/schemas/check: one of `schema` or `tools`; nothing is stored."""

    schema: dict[str, Any] | None = None
    tools: list[ToolDefinition] | None = None
    strict: bool = True  # the schema's strictness (tools: each function's own `strict`)


class SchemaCheck(Struct):
    """How faithfully each keyword would be kept, and whether strict mode would accept the schema."""

    fidelity: dict[str, Any]
    strict_accepted: bool
    strict_refusal: str | None = None  # the 400's message a strict request with this schema would get
    object: Literal["schema.check"] = "schema.check"


class SchemaList(Struct):
    data: list[SchemaEntry]
    object: Literal["list"] = "list"


class SchemaDeleted(Struct):
    id: str
    deleted: bool = True
    object: Literal["schema"] = "schema"
