"""The schema registry: POST/GET /v1/schemas, GET/DELETE /v1/schemas/{id}.

An upload is validated and compiled before it is stored, so a registered id always works in a
request (`schema_id`). Ids come from the canonical hash: the same schema twice is the same id.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody

from gateway.errors import APIError, bad_request, not_found
from gateway.pipeline import grammar_adapter
from gateway.pipeline.constraints import ConstraintPlan, check_tools, compile_plan
from gateway.pipeline.output_validation import build_output_check
from gateway.pipeline.preparation import cache_namespace
from gateway.pipeline.schema_registry import ForeignEntry
from gateway.registry.pinning import pin_schema, unpin_schema
from gateway.registry.protocol import (
    SchemaCheck,
    SchemaCheckRequest,
    SchemaDeleted,
    SchemaEntry,
    SchemaList,
    SchemaUpload,
)
from gateway.services import GatewayServices


def _upload_plan(data: JSONBody[SchemaUpload]) -> tuple[str, Any, ConstraintPlan]:
    given = [name for name in ("schema", "regex", "ebnf", "tools") if getattr(data, name) is not None]
    if len(given) != 1:
        raise bad_request(
            "Give exactly one of 'schema' (a JSON schema), 'regex', 'ebnf' or 'tools'"
            + (f"; got {', '.join(given)}." if given else "."),
            given[1] if len(given) > 1 else "schema",
        )
    field = given[0]
    if field == "schema":
        assert data.schema is not None
        return (
            "json_schema",
            data.schema,
            ConstraintPlan(kind="json_schema", payload=data.schema, param="schema", label="schema", strict=True),
        )
    if field in ("regex", "ebnf"):
        text = getattr(data, field)
        if not text.strip():
            raise bad_request(f"'{field}' must not be empty.", field)
        return (
            field,
            text,
            ConstraintPlan(
                kind=field, payload=text, param=field, label="regex" if field == "regex" else "EBNF grammar"
            ),
        )
    assert data.tools is not None
    tools = check_tools(data.tools)
    payload = {"tools": tools, "tool_choice": "auto", "parallel_tool_calls": True}
    return "tools", tools, ConstraintPlan(kind="tool_calls", payload=payload, param="tools", label="tools")


def _check_plan(data: SchemaCheckRequest) -> ConstraintPlan:
    if (data.schema is None) == (data.tools is None):
        raise bad_request(
            "Give exactly one of 'schema' (a JSON schema) or 'tools'.", "tools" if data.schema is not None else "schema"
        )
    if data.schema is not None:
        return ConstraintPlan(
            kind="json_schema", payload=data.schema, param="schema", label="schema", strict=data.strict
        )
    payload = {"tools": check_tools(data.tools), "tool_choice": "auto", "parallel_tool_calls": True}
    return ConstraintPlan(kind="tool_calls", payload=payload, param="tools", label="tools")


class SchemasController(Controller):
    path = "/schemas"
    tags = ["schemas"]

    @post("", summary="Register a JSON schema, regex, EBNF grammar or tool set (validated and compiled)")
    async def create(
        self, data: JSONBody[SchemaUpload], services: NamedDependency[GatewayServices], tenant: NamedDependency[str]
    ) -> Response[SchemaEntry]:
        kind, payload, plan = _upload_plan(data)
        constraint = await compile_plan(plan, services.grammar, services.settings.grammar_compile_timeout_s)
        # strict (the default) refuses a schema whose keywords the mask does not all enforce
        check = build_output_check(plan, constraint, data.schema_mode)
        canonical = grammar_adapter.canonical_payload_text(kind, payload)
        try:
            entry, created = services.registry.put(tenant, kind, payload, canonical, data.name, data.schema_mode)
        except ForeignEntry as e:
            raise APIError(
                409,
                f"Schema '{e.entry_id}' is stored by another Jumpgate version, in a form this "
                "server cannot read; it is kept as it is. Upload it through that version, or delete "
                "it first.",
                code="schema_stored_by_other_version",
            ) from None
        if data.pin:
            try:
                pinned = await pin_schema(
                    services.engine,
                    services.renderer,
                    cache_namespace(tenant, None),
                    entry.id,
                    kind,
                    payload,
                    data.system_prompt,
                )
            except APIError:
                if created:  # a refused pin registers nothing
                    services.registry.delete(tenant, entry.id)
                raise
            services.registry.set_pin(tenant, entry.id, data.system_prompt)  # re-applied at the next start
            entry = msgspec.structs.replace(entry, pinned_tokens=pinned)
        if check is not None:
            entry = msgspec.structs.replace(entry, fidelity=check.report.as_dict())
        return Response(entry, status_code=201 if created else 200)

    @post("/check", status_code=200, summary="Report how faithfully each keyword of a schema or tool set is enforced")
    async def check(
        self, data: JSONBody[SchemaCheckRequest], services: NamedDependency[GatewayServices]
    ) -> SchemaCheck:
        """Compiles like a request would (so a refused schema gets the same 400) and stores nothing."""
        plan = _check_plan(data)
        constraint = await compile_plan(plan, services.grammar, services.settings.grammar_compile_timeout_s)
        best_effort = build_output_check(plan, constraint, "best_effort")
        assert best_effort is not None
        try:
            build_output_check(plan, constraint, None)
            refusal = None
        except APIError as exc:
            refusal = exc.message
        return SchemaCheck(
            fidelity=best_effort.report.as_dict(), strict_accepted=refusal is None, strict_refusal=refusal
        )

    @get("", summary="List registered schemas")
    async def list_schemas(
        self, services: NamedDependency[GatewayServices], tenant: NamedDependency[str]
    ) -> SchemaList:
        return SchemaList(data=services.registry.list(tenant))

    @get("/{schema_id:str}", summary="Retrieve a registered schema")
    async def get_schema(
        self, schema_id: FromPath[str], services: NamedDependency[GatewayServices], tenant: NamedDependency[str]
    ) -> SchemaEntry:
        entry = services.registry.get(tenant, schema_id)
        if entry is None:
            raise not_found(f"No registered schema with id '{schema_id}'.", None, code="schema_not_found")
        return entry

    @delete("/{schema_id:str}", status_code=200, summary="Delete a registered schema")
    async def delete_schema(
        self, schema_id: FromPath[str], services: NamedDependency[GatewayServices], tenant: NamedDependency[str]
    ) -> SchemaDeleted:
        if not services.registry.delete(tenant, schema_id):
            raise not_found(f"No registered schema with id '{schema_id}'.", None, code="schema_not_found")
        await unpin_schema(services.engine, cache_namespace(tenant, None), schema_id)
        return SchemaDeleted(id=schema_id)
