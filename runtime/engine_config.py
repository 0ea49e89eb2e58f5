"""Engine settings (the CLI's flags map onto these one to one)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    model: str | None = None  # HF folder or GGUF file; None = the default SmolLM2-135M-Instruct
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto (fp32 on CPU, bf16 on CUDA) | float32 | bfloat16 | float16
    weights: str = "auto"  # linear-layer weight format: auto | fp32 | bf16 | q8 | q4 (GGUF-native int4)
    attention_backend: str = "auto"  # auto (triton on CUDA, torch on CPU) | torch | triton (CPU: TRITON_INTERPRET=1 only)
    cuda_graphs: bool = True  # replay decode passes from CUDA graphs (CUDA + triton attention only)
    kv_pool_tokens: int | None = None  # None = sized from available memory
    max_running_requests: int = 64
    # Requests that wait behind the running ones; once max_running + max_waiting are in the engine,
    # submit raises EngineError(code="overloaded") at once.
    max_waiting_requests: int = 256
    max_context: int | None = None  # None = the model's max_position_embeddings
    chunked_prefill_tokens: int = 512  # max prompt tokens extended per step
    schedule_policy: str = "lpm"  # lpm | dfs-weight | fcfs | random
    radix_cache: bool = True
    page_size: int = 1
    jump_forward: str = "verify"  # verify | direct | off
    max_jump_forward_tokens: int = 64
    loop_breaking: bool = True
    num_threads: int | None = None  # torch intra-op threads; None = torch's default
    seed: int = 0
    debug_invariants: bool = False  # check slot accounting after every step (tests)
    # Hierarchical KV cache (runtime/hiradix_cache.py). host_pool_tokens = 0: tiers off (L1 only).
    host_pool_tokens: int = 0  # L2: host-memory KV pool size in tokens (pinned memory on CUDA)
    disk_cache_dir: str | None = None  # L3: page files here survive restarts; None = off (needs L2)
    disk_cache_bytes: int = 16 << 30  # L3 budget; least recently used pages are deleted beyond it
    hicache_write_policy: str = "write_through"  # write_through | write_through_selective | write_back
    hicache_page_tokens: int = 64  # tree and disk page size while tiers are on
    hicache_min_load_tokens: int = 32  # shorter lower-tier hits are recomputed instead of loaded
    pin_budget_tokens: int = 0  # most tokens Engine.pin_prefix may keep resident in L1; 0 = pinning off
