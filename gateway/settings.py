"""Gateway (HTTP) settings: each field declared once with its default, help and `jumpgate serve` flag.

The engine's are `runtime.engine_config.EngineConfig`, the grammar service's
`grammar.settings.GrammarSettings`; `gateway/cli.py` generates the parser from all three.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.engine_config import EngineConfig
from runtime.settings_fields import check_settings, setting

# the gateway's own compile limit sits above the grammar service's: it only guards against a stuck service
GRAMMAR_TIMEOUT_MARGIN_S = 5.0


def default_concurrency(engine: EngineConfig) -> int:
    """In-flight generation requests the gateway admits: as many as the engine runs and queues."""
    return engine.max_running_requests + engine.max_waiting_requests


@dataclass
class Settings:
    CLI_GROUP = "HTTP gateway"

    host: str = setting("127.0.0.1", "address to listen on", flag="--host", metavar="ADDRESS")
    port: int = setting(8000, "port to listen on", flag="--port", min=0, max=65535)
    served_model_names: list[str] = setting(
        default_factory=list,
        help="extra model id accepted in requests besides the engine's (repeatable)",
        flag="--served-model-name",
        metavar="NAME",
    )
    api_keys: list[str] = setting(
        default_factory=list,
        help="accepted API key, one tenant each (repeatable; also $JUMPGATE_API_KEYS, comma-separated)",
        flag="--api-key",
        metavar="KEY",
        env="JUMPGATE_API_KEYS",
        default_text="none: no authentication",
    )
    registry_dir: str | None = setting(
        None,
        "schema registry folder",
        flag="--registry-dir",
        optional=True,
        metavar="DIR",
        default_text="$JUMPGATE_CACHE_DIR/registry, else ~/.cache/jumpgate/registry",
    )
    max_body_bytes: int = setting(
        4 * 1024 * 1024, "largest request body (413 beyond)", flag="--max-body-bytes", min=1024
    )
    max_tokens_limit: int = setting(4096, "largest max_tokens a request may ask for", flag="--max-tokens-limit", min=1)
    max_n: int = setting(8, "most choices (n) per request", flag="--max-n", min=1)
    max_concurrent_requests: int = setting(
        default_concurrency(EngineConfig()),
        "in-flight generation requests in the gateway (beyond: 503)",
        flag="--max-concurrent-requests",
        min=1,
        default_text="--max-running-requests + --max-waiting-requests",
    )
    retry_after_s: int = setting(
        1, "Retry-After seconds on a 503 overloaded", flag="--retry-after", min=0, metavar="SECONDS"
    )
    grammar_compile_timeout_s: float = setting(
        10.0 + GRAMMAR_TIMEOUT_MARGIN_S,
        "",
        above=0,
        derived=f"--grammar-compile-timeout + {GRAMMAR_TIMEOUT_MARGIN_S:g} s",
    )
    # /v1/responses with store=true: kept per tenant in a folder beside the registry, oldest dropped first
    responses_max_stored: int = setting(
        1000, "stored /v1/responses per tenant (oldest dropped beyond it)", flag="--responses-max-stored", min=1
    )
    responses_max_bytes: int = setting(
        64 * 1024 * 1024,
        "bytes of stored /v1/responses per tenant (oldest dropped beyond it)",
        flag="--responses-max-bytes",
        min=1024,
    )
    # the Batch API: files and batches per tenant in folders beside the registry (gateway/batches/)
    batch_file_max_bytes: int = setting(
        200 * 1024 * 1024, "largest file /v1/files accepts (413 beyond)", flag="--batch-file-max-bytes", min=1024
    )
    batch_max_requests: int = setting(50000, "most lines in one batch's input file", flag="--batch-max-requests", min=1)
    batch_concurrency: int = setting(
        16,
        "batch lines in flight at once (at background priority: online requests are admitted first)",
        flag="--batch-concurrency",
        min=1,
    )
    schema_prompt_budget: float = setting(
        0.5,
        "tokens the tools/schema text may take in a prompt: up to 1 a fraction of the context, above 1 a "
        "count; beyond it the text is compacted (the grammar still enforces the whole schema)",
        flag="--schema-prompt-budget",
        above=0,
        metavar="FRACTION|TOKENS",
    )
    # the model's own tool-call / reasoning format (docs/tool-formats.md)
    tool_call_format: str | None = setting(
        None,
        "tool-call format the model writes: an xgrammar model format (llama, qwen_3, qwen_3_coder, harmony, "
        "...) or hermes",
        flag="--tool-call-format",
        optional=True,
        metavar="NAME",
        default_text="detected from the chat template",
    )
    reasoning_format: str | None = setting(
        None,
        "reasoning format the model writes (none, qwen_3, deepseek_r1, harmony)",
        flag="--reasoning-format",
        optional=True,
        metavar="NAME",
        default_text="detected from the chat template",
    )
    chat_template: str | None = setting(
        None,
        "Jinja chat template file, for a model that ships none (or to replace its own)",
        flag="--chat-template",
        optional=True,
        metavar="FILE",
    )
    log_level: str = setting("info", "log verbosity", flag="--log-level", choices=("debug", "info", "warning", "error"))
    openapi: bool = setting(True, "disable the OpenAPI docs at /docs", flag="--no-docs", negative=True)

    def __post_init__(self) -> None:
        check_settings(self)

    def validate(self) -> None:
        """Checked on construction already; kept for callers that re-check after mutating a field."""
        check_settings(self)
