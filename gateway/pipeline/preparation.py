"""A validated request → what the engine needs: prompt ids, sampling params, constraint, namespace.

All request checks that need the model (context length, KV pool size, token budget) live here, so a
request the engine could never serve is a 400 before anything is queued.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import anyio

from gateway.errors import bad_request, context_length_exceeded, model_not_found
from gateway.pipeline import grammar_adapter
from gateway.pipeline.constraints import ConstraintPlan, compile_plan, plan_chat, plan_completion
from gateway.pipeline.output_validation import STRICT, OutputCheck, build_output_check
from gateway.pipeline.prompt import PromptRenderer, RenderedPrompt
from gateway.pipeline.reasoning import (
    ReasoningPlan,
    check_budget_fields,
    effort_kwargs,
    plan_reasoning,
    reasoning_constraint,
)
from gateway.pipeline.schema_registry import SchemaRegistry
from gateway.protocol import ChatCompletionRequest, CompletionRequest
from gateway.settings import Settings
from grammar import GrammarService  # a real import: msgspec reads the services' field types
from runtime.api import EngineClient, GenerateRequest
from runtime.decode.sampling import MAX_TOP_LOGPROBS, SamplingParams

_SAMPLING_PARAM_NAMES = {"max_new_tokens": "max_tokens"}


@dataclass(kw_only=True)
class PreparationServices:
    """What preparing a request reads (`GatewayServices` is one; a bench passes just these)."""

    engine: EngineClient  # its limits (context, KV pool) and model name
    grammar: GrammarService | None  # None: structured output unavailable
    renderer: PromptRenderer
    registry: SchemaRegistry | None  # the tenants' uploaded schemas (None: no schema_id resolves)
    settings: Settings
    metrics: Any = None  # GatewayMetrics: the output check counts what strict mode refuses


@dataclass
class Prepared:
    request_id: str
    created: int
    model: str
    prompt_ids: list[int]
    prompt_text: str | None
    plan: ConstraintPlan
    constraint: Any
    sampling: SamplingParams
    namespace: str
    output_check: OutputCheck | None = None  # validates structured outputs before their final chunk
    reasoning: ReasoningPlan | None = None  # the think block the output opens with (None: none)
    # special tokens whose text the output keeps: the format's markers, where the output is parsed
    keep_special_ids: frozenset[int] = frozenset()

    def engine_requests(self, n: int, jump_forward: str | None, rid_prefix: str | None = None) -> list[GenerateRequest]:
        """n engine requests; with a seed, choice i uses seed + i (distinct yet reproducible)."""
        requests = []
        for i in range(n):
            sampling = SamplingParams(
                **{
                    **self.sampling.__dict__,
                    "stop": list(self.sampling.stop),
                    "stop_token_ids": list(self.sampling.stop_token_ids),
                    "logit_bias": dict(self.sampling.logit_bias),
                }
            )
            if sampling.seed is not None:
                sampling.seed = sampling.seed + i
            requests.append(
                GenerateRequest(
                    prompt_ids=list(self.prompt_ids),
                    sampling=sampling,
                    constraint=self.constraint,
                    jump_forward=jump_forward,  # type: ignore[arg-type]
                    strict=self.plan.strict,
                    refuse_unfit=self.output_check is not None and self.output_check.mode == STRICT,
                    namespace=self.namespace,
                    rid=f"{rid_prefix or self.request_id}-{i}",
                    keep_special_ids=self.keep_special_ids,
                )
            )
        return requests


def cache_namespace(tenant: str, cache_salt: str | None) -> str:
    """Prefixes are shared only within one namespace: the tenant, optionally split further by a salt
    (`cache_salt`); a tenant's schemas are pinned in its unsalted namespace."""
    if not cache_salt:
        return tenant
    return f"{tenant}/{hashlib.sha256(cache_salt.encode()).hexdigest()[:16]}"


def served_model_names(engine: EngineClient, settings: Settings) -> list[str]:
    names = [engine.info.model_name]
    names += [n for n in settings.served_model_names if n not in names]
    return names


def check_model(model: str, engine: EngineClient, settings: Settings) -> str:
    if model not in served_model_names(engine, settings):
        raise model_not_found(model)
    return model


def check_sampling_fields(req: ChatCompletionRequest | CompletionRequest) -> None:
    """Refuse bad logit_bias / logprobs before the prompt is rendered (cheap checks first)."""
    logit_bias(req)
    logprob_count(req)


# arguments of apply_chat_template itself, or the variables Jumpgate sets: not the client's to set
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "bos_token",
        "eos_token",
    }
)


def template_kwargs(req: ChatCompletionRequest) -> dict[str, Any] | None:
    """`chat_template_kwargs` checked: variables for the template, none that Jumpgate sets."""
    kwargs = req.chat_template_kwargs
    if not kwargs:
        return None
    for key in kwargs:
        if key in RESERVED_TEMPLATE_KWARGS or not key.isidentifier():
            raise bad_request(
                f"'chat_template_kwargs' may not set {key!r}: the server sets it, or it is "
                "not a template variable name.",
                "chat_template_kwargs",
            )
    return dict(kwargs)


MAX_LOGIT_BIAS_ENTRIES = 300  # OpenAI's limit


def logit_bias(req: ChatCompletionRequest | CompletionRequest) -> dict[int, float]:
    """`logit_bias` with its keys as token ids (OpenAI sends them as strings)."""
    if not req.logit_bias:
        return {}
    if len(req.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise bad_request(f"'logit_bias' may hold at most {MAX_LOGIT_BIAS_ENTRIES} entries.", "logit_bias")
    out = {}
    for key, bias in req.logit_bias.items():
        if not key.strip().isdigit():
            raise bad_request(f"'logit_bias' keys must be token ids; got {key!r}.", "logit_bias")
        out[int(key)] = float(bias)
    return out


MAX_COMPLETION_LOGPROBS = 5  # OpenAI's limit for the legacy `logprobs` of text completions


def logprob_count(req: ChatCompletionRequest | CompletionRequest) -> int | None:
    """The engine's `SamplingParams.logprobs`: None (not asked) or how many alternatives per token."""
    if isinstance(req, CompletionRequest):
        if req.logprobs is None:
            return None
        if not 0 <= req.logprobs <= MAX_COMPLETION_LOGPROBS:
            raise bad_request(f"'logprobs' must be between 0 and {MAX_COMPLETION_LOGPROBS}.", "logprobs")
        if req.echo:
            raise bad_request(
                "'logprobs' with 'echo' is not supported: this server does not compute the prompt tokens' logprobs.",
                "echo",
            )
        return req.logprobs
    if req.top_logprobs is not None:
        if not req.logprobs:
            raise bad_request("'top_logprobs' needs 'logprobs' set to true.", "top_logprobs")
        if not 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS:
            raise bad_request(f"'top_logprobs' must be between 0 and {MAX_TOP_LOGPROBS}.", "top_logprobs")
    return (req.top_logprobs or 0) if req.logprobs else None


def stop_list(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else list(stop)
    if len(items) > 16:
        raise bad_request("'stop' may hold at most 16 sequences.", "stop")
    for i, item in enumerate(items):
        if not item:
            raise bad_request("Stop sequences must not be empty.", "stop" if isinstance(stop, str) else f"stop[{i}]")
    return items


def token_budget(
    prompt_len: int,
    requested: int | None,
    requested_param: str,
    engine: EngineClient,
    settings: Settings,
    prompt_param: str = "messages",
) -> int:
    """max_new_tokens for a prompt of `prompt_len`: the request's value checked against the context,
    the KV pool and the server's limit, or the most that fits when the request gave none."""
    max_context, pool = engine.info.max_context, engine.info.kv_pool_tokens
    room = min(max_context, pool) - prompt_len
    if room < 1:
        where = "context" if max_context <= pool else "KV cache pool"
        limit = min(max_context, pool)
        raise context_length_exceeded(
            f"This model's maximum {where} length is {limit} tokens. However, your messages resulted in "
            f"{prompt_len} tokens, leaving no room for the completion. Please reduce the length of the messages.",
            prompt_param,
        )
    if requested is None:
        return max(1, min(room, settings.max_tokens_limit))
    if requested > settings.max_tokens_limit:
        raise bad_request(
            f"'{requested_param}' is {requested}; this server allows at most {settings.max_tokens_limit}.",
            requested_param,
        )
    if requested > room:
        total = prompt_len + requested
        raise context_length_exceeded(
            f"This model's maximum context length is {prompt_len + room} tokens. However, you requested {total} "
            f"tokens ({prompt_len} in the messages, {requested} in the completion). Please reduce the length of "
            "the messages or completion.",
            requested_param,
        )
    return requested


def sampling_params(
    req: ChatCompletionRequest | CompletionRequest, max_new_tokens: int, stop: list[str]
) -> SamplingParams:
    params = SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=1.0 if req.temperature is None else float(req.temperature),
        top_p=1.0 if req.top_p is None else float(req.top_p),
        top_k=-1 if req.top_k is None else int(req.top_k),
        min_p=0.0 if req.min_p is None else float(req.min_p),
        seed=req.seed,
        stop=stop,
        ignore_eos=req.ignore_eos,
        logprobs=logprob_count(req),
        presence_penalty=float(req.presence_penalty or 0.0),
        frequency_penalty=float(req.frequency_penalty or 0.0),
        repetition_penalty=1.0 if req.repetition_penalty is None else float(req.repetition_penalty),
        logit_bias=logit_bias(req),
        min_tokens=req.min_tokens or 0,
        stop_token_ids=list(req.stop_token_ids or []),
    )
    try:
        params.validate()
    except ValueError as exc:
        field, _, reason = str(exc).partition(":")
        field = field.strip()
        raise bad_request(
            f"Invalid value for '{_SAMPLING_PARAM_NAMES.get(field, field)}': {reason.strip() or exc}",
            _SAMPLING_PARAM_NAMES.get(field, field),
        ) from exc
    return params


def check_n(n: int, settings: Settings) -> None:
    if n > settings.max_n:
        raise bad_request(f"'n' is {n}; this server allows at most {settings.max_n}.", "n")


def schema_mode_of(req: ChatCompletionRequest | CompletionRequest, registry: SchemaRegistry, tenant: str) -> str | None:
    """The request's schema_mode, else the one its registered schema was uploaded with."""
    if req.schema_mode is not None or req.schema_id is None:
        return req.schema_mode
    entry = registry.get(tenant, req.schema_id)
    return entry.schema_mode if entry is not None else None


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


async def prepare_chat(
    req: ChatCompletionRequest,
    services: PreparationServices,
    tenant: str,
    *,
    compile: bool = True,
    render: Callable[..., RenderedPrompt] | None = None,
) -> Prepared:
    """`render(messages, tools, instructions)` replaces `renderer.render_chat` (the Responses API
    renders a chained turn so that it extends the previous turn's exact ids)."""
    engine, renderer, registry, settings = services.engine, services.renderer, services.registry, services.settings
    check_model(req.model, engine, settings)
    if not req.messages:
        raise bad_request("'messages' must contain at least one message.", "messages")
    check_sampling_fields(req)
    check_budget_fields(req.reasoning_effort, req.thinking_budget)
    extra_vars = effort_kwargs(req.reasoning_effort, template_kwargs(req))
    check_n(req.n, settings)
    stop = stop_list(req.stop)
    if (
        req.max_tokens is not None
        and req.max_completion_tokens is not None
        and req.max_tokens != req.max_completion_tokens
    ):
        raise bad_request("Give either 'max_tokens' or 'max_completion_tokens', not both.", "max_tokens")
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    requested_param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"

    plan = plan_chat(req, registry, tenant)
    # template rendering (jinja) and tokenizing are CPU work: keep them off the event loop
    schema = (plan.kind, plan.payload) if plan.kind else None  # lets a long schema's text be compacted
    render = render or renderer.render_chat
    extra = {"template_kwargs": extra_vars} if extra_vars else {}
    rendered = await anyio.to_thread.run_sync(
        lambda: render(req.messages, plan.tools, plan.instructions, schema, **extra)
    )
    max_new = token_budget(len(rendered.token_ids), requested, requested_param, engine, settings)
    sampling = sampling_params(req, max_new, stop)
    constraint = await compile_plan(plan, services.grammar, settings.grammar_compile_timeout_s) if compile else None
    # strict mode refuses a schema the mask cannot guarantee (a 400 naming each keyword)
    check = None
    if compile:
        check = build_output_check(plan, constraint, schema_mode_of(req, registry, tenant), metrics=services.metrics)
    reasoning = plan_reasoning(
        rendered.text,
        max_new,
        req.reasoning_effort,
        req.thinking_budget,
        plan.kind is not None,
        tools=plan.kind == "tool_calls",
    )
    if reasoning is not None and compile:  # the block first, the constraint after it
        constraint = await reasoning_constraint(reasoning, constraint, services.grammar, engine.tokenizer, max_new)
    return Prepared(
        request_id=new_id("chatcmpl"),
        created=int(time.time()),
        model=req.model,
        prompt_ids=rendered.token_ids,
        prompt_text=rendered.text,
        plan=plan,
        constraint=constraint,
        sampling=sampling,
        namespace=cache_namespace(tenant, req.cache_salt),
        output_check=check,
        reasoning=reasoning,
        # the parsers (tool calls, think block) read the markers and strip them; elsewhere
        # special tokens stay out of the text as before
        keep_special_ids=grammar_adapter.marker_ids() if plan.parse_tool_calls or reasoning else frozenset(),
    )


def completion_prompts(prompt: str | list[Any], vocab_size: int) -> list[str | list[int]]:
    """Normalize OpenAI's four prompt shapes to a list of (text | token ids)."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise bad_request("'prompt' must not be empty.", "prompt")
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        prompts: list[str | list[int]] = [list(prompt)]
    elif all(isinstance(p, list) for p in prompt):
        prompts = [list(p) for p in prompt]
    else:
        raise bad_request(
            "'prompt' must be a string, a list of strings, a list of token ids, or a list of token id lists.", "prompt"
        )
    for i, ids in enumerate(prompts):
        if not ids:
            raise bad_request("Token id prompts must not be empty.", f"prompt[{i}]")
        for t in ids:  # type: ignore[union-attr]
            if not 0 <= int(t) < vocab_size:
                raise bad_request(f"Token id {t} is outside the vocabulary (size {vocab_size}).", "prompt")
    return prompts


async def prepare_completion(
    req: CompletionRequest,
    prompt: str | list[int],
    services: PreparationServices,
    tenant: str,
    *,
    plan: ConstraintPlan | None = None,
    constraint: Any = None,
) -> Prepared:
    """One prompt of a completion request (the plan/constraint are shared between prompts)."""
    if plan is None:
        plan = plan_completion(req, services.registry, tenant)
        constraint = await compile_plan(plan, services.grammar, services.settings.grammar_compile_timeout_s)
    if isinstance(prompt, str):
        ids = await anyio.to_thread.run_sync(services.renderer.encode_completion_prompt, prompt)
        text: str | None = prompt
    else:
        ids, text = list(prompt), None
    if not ids:
        raise bad_request("'prompt' must not be empty.", "prompt")
    max_new = token_budget(
        len(ids), req.max_tokens, "max_tokens", services.engine, services.settings, prompt_param="prompt"
    )
    return Prepared(
        request_id=new_id("cmpl"),
        created=int(time.time()),
        model=req.model,
        prompt_ids=ids,
        prompt_text=text,
        plan=plan,
        constraint=constraint,
        sampling=sampling_params(req, max_new, stop_list(req.stop)),
        namespace=cache_namespace(tenant, req.cache_salt),
    )


def vocab_size(tokenizer: Any) -> int:
    try:
        return len(tokenizer)
    except TypeError:
        return int(getattr(tokenizer, "vocab_size", 0) or 0)
