"""GET /v1/models and /v1/models/{id}."""

from __future__ import annotations

from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.params import FromPath
from msgspec import UNSET

from gateway.errors import model_not_found
from gateway.pipeline.preparation import served_model_names
from gateway.protocol import Model, ModelFormatsInfo, ModelList
from gateway.services import GatewayServices


def _models(services: NamedDependency[GatewayServices]) -> list[Model]:
    formats = services.formats
    info = (
        ModelFormatsInfo(
            tool_call_format=formats.tool_call, reasoning_format=formats.reasoning, detected=formats.detected
        )
        if formats is not None
        else UNSET
    )
    return [
        Model(id=name, created=services.started_at, max_model_len=services.engine.info.max_context, jumpgate=info)
        for name in served_model_names(services.engine, services.settings)
    ]


class ModelsController(Controller):
    path = "/models"
    tags = ["models"]

    @get("", summary="List the served models")
    async def list_models(self, services: NamedDependency[GatewayServices]) -> ModelList:
        return ModelList(data=_models(services))

    @get("/{model_id:path}", summary="Retrieve a model")
    async def get_model(self, model_id: FromPath[str], services: NamedDependency[GatewayServices]) -> Model:
        model_id = model_id.lstrip("/")
        for model in _models(services):
            if model.id == model_id:
                return model
        raise model_not_found(model_id, param="model")
