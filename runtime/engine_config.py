"""Engine settings (the CLI's flags map onto these one to one)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    model: str | None = None  # HF folder or GGUF file; None = the default SmolLM2-135M-Instruct
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto (fp32 on CPU, bf16 on CUDA) | float32 | bfloat16 | float16
    kv_pool_tokens: int | None = None  # None = sized from available memory
    max_running_requests: int = 64
    max_waiting_requests: int = 256  # beyond this, submit raises EngineError(code="overloaded")
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
