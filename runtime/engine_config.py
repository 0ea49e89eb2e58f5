"""Engine settings: each field declared once with its default, help and `jumpgate serve` flag.

Checked on construction (`__post_init__`), so an Engine never starts from a bad config; the CLI's
"engine" flags are generated from these declarations (runtime/settings_fields.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.decode.completeness import MAX_DIGITS
from runtime.settings_fields import check_settings, flag_of, setting

TIERS = "hierarchical KV cache (host and disk tiers, pinning)"


@dataclass
class EngineConfig:
    CLI_GROUP = "model and engine"

    model: str | None = setting(
        None,
        "Hugging Face folder or GGUF file",
        flag="--model",
        optional=True,
        metavar="PATH",
        default_text="SmolLM2-135M-Instruct",
    )
    device: str = setting("auto", "where the model runs", flag="--device", choices=("auto", "cpu", "cuda"))
    dtype: str = setting(
        "auto",
        "activation / KV dtype (auto: float32 on CPU, bfloat16 on CUDA)",
        flag="--dtype",
        choices=("auto", "float32", "bfloat16", "float16"),
    )
    weights: str = setting(
        "auto",
        "linear-layer weight format (q4: GGUF-native int4; auto: q4 on a CPU with native bf16 under the "
        "cpu attention backend, fp32 elsewhere on CPU)",
        flag="--weights",
        choices=("auto", "fp32", "bf16", "q8", "q4"),
    )
    attention_backend: str = setting(
        "auto",
        "auto: triton on CUDA; on CPU cpu, a batch-invariant C++ kernel built on first use (torch "
        "where it cannot be built); torch: SDPA (triton on CPU needs TRITON_INTERPRET=1)",
        flag="--attention-backend",
        choices=("auto", "torch", "triton", "cpu"),
    )
    attention_tiles: str = setting(
        "auto",
        "the cpu attention kernel's products on AMX tiles (q4, q8 and bf16 weights on a CPU with AMX; without "
        "AMX, on AVX512-BF16 at bf16 precision, its scores from bf16 dot products): "
        "long prompts prefill faster and a shared prefix's decode costs less, decoding over long unshared contexts "
        "more (docs/perf-log.md); auto: on wherever it can run, on: the same but say where it cannot",
        flag="--attention-tiles",
        choices=("auto", "on", "off"),
    )
    attention_precision: str = setting(
        "auto",
        "the precision of those tile (or dot) products: bf16 (q and k rounded to bf16, one product a score with "
        "float32 sums: the fastest), float32 (q and k each split into two bf16 words, three products a "
        "score, within 1e-4 of float32); auto: bf16 (docs/serving.md)",
        flag="--attention-precision",
        choices=("auto", "bf16", "float32"),
    )
    cuda_graphs: bool = setting(
        True,
        "run decode passes eagerly on CUDA instead of replaying CUDA graphs (graphs: CUDA + triton only)",
        flag="--no-cuda-graphs",
        negative=True,
    )
    cascade_attention: bool = setting(
        True,
        "attend to every request's whole context separately, also where requests share a cached prefix "
        "(cascade: the shared prefix is read once per layer for all of them; torch and cpu backends)",
        flag="--no-cascade-attention",
        negative=True,
    )
    kv_pool_tokens: int | None = setting(
        None,
        "KV cache size in tokens",
        flag="--kv-pool-tokens",
        type=int,
        min=1,
        optional=True,
        default_text="sized from free memory",
    )
    window_kv_tokens: int | None = setting(
        None,
        "window-layer KV slots of a sliding-window model (Gemma 3, gpt-oss): its window layers keep only "
        "the positions still in their window (0: every layer keeps every position)",
        flag="--window-kv-tokens",
        type=int,
        min=0,
        optional=True,
        default_text="a quarter of the KV pool, at least one request's window + 96 + one prefill chunk; 0 where "
        "that is the whole pool, where every layer is windowed (Phi-3, Mistral v0.1), under tensor parallelism "
        "or with the host tier",
    )
    max_running_requests: int = setting(64, "requests decoded together", flag="--max-running-requests", min=1)
    # once running + waiting requests are in the engine, submit raises EngineError(code="overloaded")
    max_waiting_requests: int = setting(
        256, "requests queued behind the running ones (beyond: 503 overloaded)", flag="--max-waiting-requests", min=1
    )
    max_context: int | None = setting(
        None,
        "longest prompt + output in tokens",
        flag="--max-context",
        type=int,
        min=1,
        optional=True,
        default_text="the model's",
    )
    chunked_prefill_tokens: int = setting(
        512,
        "prompt tokens extended per step, so long prompts do not stall decoding",
        flag="--chunked-prefill-tokens",
        min=1,
    )
    schedule_policy: str = setting(
        "lpm",
        "order of admission from the waiting queue",
        flag="--schedule-policy",
        choices=("lpm", "dfs-weight", "fcfs", "random"),
    )
    radix_cache: bool = setting(True, "disable prefix reuse (RadixAttention)", flag="--no-radix-cache", negative=True)
    page_size: int = setting(1, "prefix-cache page size in tokens", flag="--page-size", min=1)
    jump_forward: str = setting(
        "verify",
        "forced grammar text: verify (exact), direct (unverified), off",
        flag="--jump-forward",
        choices=("verify", "direct", "off"),
    )
    max_jump_forward_tokens: int = setting(
        64, "most tokens one jump-forward step appends", flag="--max-jump-forward-tokens", min=1
    )
    speculative: str = setting(
        "ngram",
        "prompt-lookup drafts, verified in the same pass (outputs unchanged): ngram, off",
        flag="--speculative",
        choices=("ngram", "off"),
    )
    speculative_tokens: int = setting(
        8, "most prompt-lookup draft tokens a step verifies", flag="--speculative-tokens", min=1
    )
    speculative_row_cost: float | None = setting(
        None,
        "cost of one more logits row, as a share of what a decode step spends per output token: a draft "
        "token is queued only while its chance of being kept is higher",
        flag="--speculative-row-cost",
        type=float,
        min=0.0,
        optional=True,
        default_text="measured: fitted on the engine's own decode steps (0.1 until it has seen enough)",
    )
    speculative_shared: bool = setting(
        False,
        "also draft from the answers of the requests whose first 64 prompt tokens and cache namespace "
        "are the same (an agent's next tool call, the next record from one document)",
        flag="--speculative-shared",
    )
    loop_breaking: bool = setting(
        True,
        "do not close a strict JSON value that repeats itself (loop breaking)",
        flag="--no-loop-breaking",
        negative=True,
    )
    max_number_digits: int = setting(
        MAX_DIGITS,
        "loop breaking ends a strict JSON number after this many digits in a row (integer part, fraction or exponent)",
        flag="--max-number-digits",
        min=1,
    )
    tensor_parallel_size: int = setting(
        1,
        "processes one replica's model is split across (1, 2 or 4; runtime/parallel/): column/row-parallel "
        "linear layers, the KV heads split; gloo between CPU processes, NCCL between GPUs",
        flag="--tensor-parallel-size",
        min=1,
        max=4,
    )
    rank_memory_budget_mb: int | None = setting(
        None,
        "the most MiB of weights one process (one tensor-parallel rank) may hold; a model above it is refused at load",
        flag="--rank-memory-budget-mb",
        type=int,
        min=1,
        optional=True,
        default_text="none",
    )
    num_threads: int | None = setting(
        None, "torch intra-op threads", flag="--num-threads", type=int, min=1, optional=True, default_text="torch's"
    )
    seed: int = setting(0, "scheduler and sampling seed", flag="--seed")
    debug_invariants: bool = setting(
        False, "check KV slot accounting after every step (slow; for tests)", flag="--debug-invariants"
    )
    # Hierarchical KV cache (runtime/kvcache/hiradix_cache.py). host_pool_tokens = 0: tiers off (device only).
    host_pool_tokens: int = setting(
        0,
        "host-memory KV tier size in tokens, pinned memory on CUDA (0 = tiers off)",
        flag="--host-pool-tokens",
        min=0,
        group=TIERS,
    )
    disk_cache_dir: str | None = setting(
        None,
        "disk KV tier folder, reused after a restart (needs --host-pool-tokens)",
        flag="--disk-cache-dir",
        optional=True,
        metavar="DIR",
        default_text="off",
        group=TIERS,
    )
    disk_cache_bytes: int = setting(
        16 << 30,
        "disk tier budget; least recently used pages are deleted beyond it",
        flag="--disk-cache-bytes",
        min=1,
        group=TIERS,
    )
    hicache_write_policy: str = setting(
        "write_through",
        "when device-tier KV is copied down to the host tier",
        flag="--hicache-write-policy",
        choices=("write_through", "write_through_selective", "write_back"),
        group=TIERS,
    )
    hicache_page_tokens: int = setting(
        64, "tree and disk page size while the tiers are on", flag="--hicache-page-tokens", min=1, group=TIERS
    )
    hicache_min_load_tokens: int = setting(
        32,
        "lower-tier hits shorter than this are recomputed instead of loaded",
        flag="--hicache-min-load-tokens",
        min=0,
        group=TIERS,
    )
    pin_budget_tokens: int = setting(
        0,
        "tokens of pinned schema prefixes kept in the device cache (0 = pinning off)",
        flag="--pin-budget-tokens",
        min=0,
        group=TIERS,
    )

    def __post_init__(self) -> None:
        check_settings(self)
        tp = flag_of(self, "tensor_parallel_size")
        if self.tensor_parallel_size not in (1, 2, 4):
            raise ValueError(f"{tp}: must be 1, 2 or 4, not {self.tensor_parallel_size}")
        if self.tensor_parallel_size > 1 and self.host_pool_tokens:
            raise ValueError(
                f"{tp} {self.tensor_parallel_size}: the host and disk KV tiers ({flag_of(self, 'host_pool_tokens')}) "
                "copy only rank 0's KV heads; run them with one rank"
            )
        if self.disk_cache_dir and not self.host_pool_tokens:
            raise ValueError(
                f"{flag_of(self, 'disk_cache_dir')} needs the host tier: set "
                f"{flag_of(self, 'host_pool_tokens')} (host_pool_tokens) > 0"
            )
        if self.host_pool_tokens and self.hicache_page_tokens % self.page_size:
            raise ValueError(
                f"{flag_of(self, 'hicache_page_tokens')}: must be a multiple of "
                f"{flag_of(self, 'page_size')} ({self.page_size}), not {self.hicache_page_tokens}"
            )
