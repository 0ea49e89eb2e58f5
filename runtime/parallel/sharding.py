"""Which models split across ranks, and each rank's slice of the weights (Megatron's layout).

Column-parallel (rows split): q/k/v by heads (each rank its `heads / N` query heads and the
`kv_heads / N` KV heads they read, so GQA groups stay whole), gate and up by MLP columns, and the
embedding and logits matrices by vocabulary (padded to a multiple of N with zero rows).
Row-parallel (input columns split): o_proj and down_proj, whose partial outputs the ranks sum.
Everything else (norms, q/k norms) is whole on every rank. Weights use Hugging Face Llama names
after the family's own renaming (runtime/model/families/family.py `weights`).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from runtime.model.config import ModelConfig, ModelLoadError

FLAG = "--tensor-parallel-size"
SPLIT_FORMATS = ("fp32", "bf16", "fp16")  # dense formats only: q4/q8 codes are not sliced yet
COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # rows split
ROW = ("o_proj", "down_proj")  # input columns split
VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


def check_shardable(mc: ModelConfig, size: int, device: torch.device, weights: str = "auto") -> None:
    """One clear ModelLoadError for a model, weight format or place that `size` ranks cannot split."""
    if weights not in ("auto", *SPLIT_FORMATS):
        raise ModelLoadError(f"--weights {weights}: not split across ranks ({FLAG} {size} takes fp32 or bf16)")
    if mc.num_experts > 0:
        raise ModelLoadError(
            f"{FLAG} {size}: mixture-of-experts models ({mc.model_type}) are not split across ranks; "
            f"serve it with {FLAG} 1"
        )
    if mc.num_kv_heads % size:
        raise ModelLoadError(
            f"{FLAG} {size}: the model's {mc.num_kv_heads} KV heads do not split evenly across {size} ranks "
            f"(num_key_value_heads must be a multiple of the size)"
        )
    if mc.intermediate_size % size:
        raise ModelLoadError(
            f"{FLAG} {size}: the model's MLP width {mc.intermediate_size} does not split evenly across {size} ranks"
        )
    if device.type == "cuda" and torch.cuda.device_count() < size:
        raise ModelLoadError(f"{FLAG} {size}: only {torch.cuda.device_count()} CUDA devices (one per rank)")
    if device.type not in ("cpu", "cuda"):
        raise ModelLoadError(f"{FLAG} {size}: runs on cpu (gloo) or cuda (NCCL), not {device.type}")


def split_format(requested: str, resolved: str, reason: str, dtype: torch.dtype, size: int) -> tuple[str, str]:
    """The weight format of a split model: dense. An explicit q4/q8 is refused; `auto`'s q4 falls
    back to the engine dtype's dense format."""
    if resolved in SPLIT_FORMATS:
        return resolved, reason
    if requested != "auto":
        raise ModelLoadError(f"--weights {requested}: not split across ranks ({FLAG} {size} takes fp32 or bf16)")
    fmt = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")
    return fmt, f"{FLAG} {size}: dense weights in the engine dtype (q4/q8 codes are not split across ranks)"


def vocab_shard_rows(vocab: int, size: int) -> int:
    """Rows of the embedding each rank holds (the vocabulary padded to a multiple of `size`)."""
    return -(-vocab // size)


def shard_weights(
    w: dict[str, torch.Tensor], mc: ModelConfig, rank: int, size: int
) -> tuple[dict[str, torch.Tensor], ModelConfig]:
    """Rank `rank`'s slices (copies: the whole tensors can be freed) and the shape it runs: its
    heads, KV heads and MLP columns."""
    out = {}
    for name, t in w.items():
        kind = name.rsplit(".", 2)[-2] if name.count(".") >= 2 else ""
        if name in VOCAB:
            rows = vocab_shard_rows(t.shape[0], size)
            mine = t[rank * rows : (rank + 1) * rows]  # the last rank's is short by the padding
            out[name] = torch.zeros(rows, *t.shape[1:], dtype=t.dtype)
            out[name][: mine.shape[0]] = mine
        elif kind in COLUMN or name.endswith("self_attn.sinks"):  # sinks: one per query head
            out[name] = _slice(t, 0, rank, size)
        elif kind in ROW and name.endswith(".weight"):
            out[name] = _slice(t, 1, rank, size)
        elif kind in ROW:  # a row-parallel bias: added once, by rank 0, before the sum
            if rank == 0:
                out[name] = t
        else:
            out[name] = t  # norms, q/k norms
    local = replace(
        mc,
        num_heads=mc.num_heads // size,
        num_kv_heads=mc.num_kv_heads // size,
        intermediate_size=mc.intermediate_size // size,
    )
    return out, local


def _slice(t: torch.Tensor, dim: int, rank: int, size: int) -> torch.Tensor:
    if t.shape[dim] % size:
        raise ModelLoadError(f"{FLAG} {size}: a weight of shape {tuple(t.shape)} does not split evenly")
    return t.chunk(size, dim=dim)[rank].clone()
