"""The attention contract every backend implements (torch for CPU, Triton for CUDA).

Attention runs over the slot-based KV pool: each request's new tokens attend to all of its slots
(cached prefix + themselves), causally and bottom-right aligned, so new token i of a request with
`prefix` cached tokens sees positions <= prefix + i. A sliding-window layer passes `window` (> 0): a token at
position i then sees positions j with i - window < j <= i only (transformers' sliding mask); 0 is
every position. The window is per call (per layer), the rest of the pass's metadata is shared.
Attention sinks (gpt-oss; `sinks`, a float32 logit per query head, per call): each row's softmax
denominator gains exp(sink), with no value, so the row's weights sum to less than 1
(transformers' eager_attention_forward with `s_aux`). A backend without them says so
(`supports_sinks`), and the engine refuses such a model on it at start-up.

Per forward pass the model calls `prepare(batch)` once, then `forward` once per layer; `prepare`
builds the gather indices and masks that every layer reuses. When `forward` runs, this pass's K/V
are already written into the pool (the model writes them first).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from runtime.attention.cascade import MIN_SAVED_TOKENS
from runtime.forward_batch import ForwardBatch


class AttentionBackend(ABC):
    name = "abstract"
    # True: `prepare` honours ForwardBatch.prefix_groups (shared-prefix / cascade attention)
    supports_prefix_groups = False
    # The fewest prefix reads a group must save for the model runner to form it (measured on the
    # CPU backends; a backend may need more to pay)
    min_saved_prefix_reads = MIN_SAVED_TOKENS
    # True: a row's output is bitwise the same whatever else is in the pass (alone, batched, as a
    # decode or inside an extend); weight formats that round activations rely on it
    batch_invariant = False
    # the KV pool's layout this backend reads fastest (runtime/kvcache/pool.py)
    kv_head_major = False
    supports_sinks = False  # True: `forward` takes attention sinks (module docstring)

    def enable_tiles(self, weights: str, precision: str = "float32") -> bool:
        """Run the products on matrix tiles for a model with `weights` (--attention-tiles), at
        `precision` (bf16 or float32: --attention-precision); False where this backend cannot
        (only the cpu kernel can: cpu_backend.py)."""
        return False

    @abstractmethod
    def prepare(self, batch: ForwardBatch) -> None:
        """Precompute per-pass metadata (called once before the layers run)."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        window: int = 0,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q: [T, H, D]; caches: [num_slots, KVH, D] (this pass's K/V already written) -> [T, H, D].
        `window` > 0: a sliding-window layer; `sinks` [H]: attention sinks (see the module docstring)."""

    def forward_as(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        dtype: torch.dtype,
        window: int = 0,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`forward`'s result in `dtype` (the next layer's input dtype); a backend that can write it
        so directly saves the conversion pass."""
        return self.forward(q, k_cache, v_cache, window, sinks).to(dtype)

    def paged_tables(self) -> tuple[torch.Tensor, torch.Tensor, bool, bool] | None:
        """(slots, meta, tiles, bf16 products) of the prepared pass, what the cpu kernel takes, for a caller that
        runs every layer in C++ (runtime/cpu_kernels/decoder_layers.cpp); None where this backend
        is not that kernel."""
        return None


def refuse_sinks(backend: AttentionBackend, sinks: torch.Tensor | None) -> None:
    """One clear line where a backend without attention sinks is handed them."""
    if sinks is not None:
        raise ValueError(
            f"attention backend {backend.name!r} has no attention sinks (gpt-oss); use --attention-backend torch or cpu"
        )
