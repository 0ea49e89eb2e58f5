"""One rank's shard of the decoder: the shared decoder (runtime/model/decoder.py) over this rank's
slices (runtime/parallel/sharding.py), with the collectives where a split layer's outputs meet.

- o_proj and down_proj are row-parallel: each rank's partial output is summed over the ranks
  (`RowParallel`), so the residual stream is whole on every rank after each of them.
- The embedding is vocabulary-parallel: a rank looks up the ids in its rows, zeros the others,
  and the ranks sum (`embed_tokens`).
- The logits layer is vocabulary-parallel: each rank computes its columns, rank 0 gathers them
  (`VocabParallelHead`); the other ranks' logits are thrown away.
Every rank runs the same pass, so the collectives meet in the same order. The one-call C++ layer
loop has no collective step: a split model runs the Python layer loop.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from runtime.model.config import ModelConfig, ModelLoadError
from runtime.model.decoder import DecoderModel, resolve_format
from runtime.parallel.group import TPGroup
from runtime.parallel.sharding import check_shardable, shard_weights, split_format, vocab_shard_rows


class RowParallel:
    """A linear layer over this rank's input columns; the output summed over the ranks."""

    def __init__(self, inner, group: TPGroup):
        self.inner, self.group = inner, group

    @property
    def act_dtype(self) -> torch.dtype:
        return self.inner.act_dtype

    def loop_spec(self):
        return None  # the C++ layer loop cannot all-reduce

    def native(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(self.inner.native(x))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(self.inner(x))


class VocabParallelHead:
    """The logits layer over this rank's vocabulary rows; rank 0 gathers every rank's columns."""

    def __init__(self, inner, group: TPGroup, vocab: int):
        self.inner, self.group, self.vocab = inner, group, vocab

    @property
    def act_dtype(self) -> torch.dtype:
        return self.inner.act_dtype

    def native(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.gather_columns(self.inner.native(x))[:, : self.vocab]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.gather_columns(self.inner(x))[:, : self.vocab]


class ShardedDecoderModel(DecoderModel):
    def __init__(self, cfg: ModelConfig, weights, device, dtype, fmt: str, reason: str, group: TPGroup):
        self.group = group
        self.vocab_rows = vocab_shard_rows(cfg.vocab_size, group.size)
        shard = partial(shard_weights, rank=group.rank, size=group.size)
        super().__init__(cfg, weights, device, dtype, fmt, reason, shard=shard)
        self._loop = None  # built from the unwrapped layers; the Python loop runs the collectives
        self.lm_head = VocabParallelHead(self.lm_head, group, cfg.vocab_size)
        for layer in self.layers:
            layer.o_proj = RowParallel(layer.o_proj, group)
            layer.down = RowParallel(layer.down, group)

    @property
    def layer_loop(self) -> object | None:
        return None

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.group.rank * self.vocab_rows
        outside = (local < 0) | (local >= self.vocab_rows)
        h = F.embedding(local.masked_fill(outside, 0), self.embed)
        return self.group.all_reduce(h.masked_fill(outside.unsqueeze(1), 0.0))


def load_sharded_model(
    model_dir: Path, mc: ModelConfig, weights: str, device: torch.device, dtype: torch.dtype, group: TPGroup
) -> ShardedDecoderModel:
    """This rank's shard in a dense format (runtime/parallel/sharding.py says which)."""
    check_shardable(mc, group.size, device, weights)
    fmt, reason = resolve_format(model_dir, weights, device, dtype)
    fmt, reason = split_format(weights, fmt, reason, dtype, group.size)
    reason = f"{reason}; split across {group.size} tensor-parallel ranks ({group.backend})"  # the banner says so
    return ShardedDecoderModel(mc, LazyWeights(model_dir), device, dtype, fmt, reason, group)


class LazyWeights(Mapping):
    """A model folder's safetensors read one tensor at a time, when asked: the sharding keeps a
    slice of each and lets the whole tensor go, so a rank's peak at load is its shard plus the
    largest single tensor, not the whole model (for a family whose `weights` passes the tensors
    through, as Llama, Mistral, Qwen2 and Qwen3 do; one that rebuilds them all, Phi-3's split or
    Gemma's norms, still holds every tensor once)."""

    def __init__(self, model_dir: Path):
        from safetensors import SafetensorError, safe_open

        files = sorted(model_dir.glob("*.safetensors"))
        if not files:
            raise ModelLoadError(f"{model_dir}: no *.safetensors weight files")
        self._where = {}
        for path in files:
            try:
                handle = safe_open(str(path), framework="pt")
            except (SafetensorError, OSError, ValueError) as e:
                raise ModelLoadError(f"{path}: corrupt or unreadable safetensors file ({e})") from e
            self._where.update({name: handle for name in handle.keys()})

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._where[name].get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)
