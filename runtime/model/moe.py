"""A mixture-of-experts MLP (Qwen3-MoE, Mixtral): a router picks each token's top-k experts.

Routing is transformers': softmax of the router logits in float32, the top k, renormalized to sum
to 1 where the config says (`norm_topk_prob`; Mixtral always). The experts of a pass run grouped:
the (token, expert) pairs are sorted by expert (stable, so a token's contributions are added in
expert order whatever else is in the batch), each active expert runs one matmul over its rows, and
the weighted rows are added back per token. With the router summed in float64 (`route`), a row's
output does not depend on the rest of the pass wherever the experts' kernels do not (q4, q8). Each expert's gate_up and down are linear layers in the
model's weight format (runtime/model/linear.py), so q4/q8 experts run the same kernels as dense
layers; the C++ one-call layer loop (runtime/cpu_kernels/decoder_layers.cpp) has no routing step,
so a MoE model runs the per-layer Python loop (`loop_spec()` is None).
A shared expert (Qwen2-MoE's, where a config has one) runs on every token, scaled by a sigmoid gate
(its gate product in float64 too).
gpt-oss's differ (runtime/model/families/gpt_oss.py): the router has a bias and softmaxes the top k
logits alone (`softmax_after_topk`), and its experts' gate is a clamped SwiGLU (`clamped_swiglu`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
import torch.nn.functional as F

from runtime.model.config import ModelLoadError

# checkpoint names of stacked experts ([experts, rows, cols]: transformers >= 5's in-memory form,
# `mlp.experts.gate_up_proj` without a `.weight`, or a GGUF's `ffn_*_exps` as runtime/model/loader.py
# names them) -> per-expert names
STACKED = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|gate_proj|up_proj|down_proj)(?:\.weight)?$")


def split_stacked_experts(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`mlp.experts.{gate_up,gate,up,down}_proj.weight` stacked over experts -> one tensor per expert
    (`mlp.experts.{e}.gate_proj.weight`, ...). transformers' fused `gate_up_proj` is [E, 2I, H]
    (gate rows first) and its `down_proj` [E, H, I], already `y = x @ W.T` per expert."""
    out = {}
    for name, w in weights.items():
        m = STACKED.match(name)
        if m is None or w.dim() != 3:
            out[name] = w
            continue
        base, kind = m.groups()
        for e, we in enumerate(w.unbind(0)):
            if kind == "gate_up_proj":
                out[f"{base}.{e}.gate_proj.weight"], out[f"{base}.{e}.up_proj.weight"] = we.chunk(2)
            else:
                out[f"{base}.{e}.{kind}.weight"] = we
    return out


def check_experts(fields: dict) -> dict:
    """A MoE family's config fields, refused in one line where they name no experts to route to."""
    experts, top_k = fields["num_experts"], fields["experts_per_token"]
    if not 0 < top_k <= experts:
        raise ModelLoadError(
            f"config.json: {top_k} experts per token of {experts}: a MoE model needs 0 < top-k <= experts"
        )
    return fields


class MoEMLP:
    """Routed experts (plus an optional shared expert) in place of a dense MLP. `experts`: one
    (gate_up, down) pair of linear layers per expert; `router`: [experts, hidden] (`mlp.gate.weight`)."""

    def __init__(
        self,
        router: torch.Tensor,
        experts: list[tuple],
        top_k: int,
        norm_topk_prob: bool,
        shared: tuple | None = None,
        shared_gate: torch.Tensor | None = None,
        router_bias: torch.Tensor | None = None,
        softmax_after_topk: bool = False,
        glu: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        if not 0 < top_k <= len(experts) or router.shape[0] != len(experts):
            raise ValueError(f"moe: top {top_k} of {len(experts)} experts, router rows {router.shape[0]}")
        # float64 (see route), [hidden, experts]: x @ it beat F.linear's float64 path on the dev box
        # (hidden 2048, 128 experts, 1 thread: 2 rows 0.05 against 0.23 ms, 16 rows 0.14 against 0.39 ms)
        self.router = router.double().t().contiguous()
        self.experts = experts
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.shared = shared
        self.shared_gate = None if shared_gate is None else shared_gate.double().reshape(1, -1)  # [1, hidden]
        self.router_bias = None if router_bias is None else router_bias.double()
        self.softmax_after_topk = softmax_after_topk
        self.glu = glu or silu_glu  # the experts' gate: gate_up's output -> down's input

    @staticmethod
    def loop_spec():
        """None: routing has no step in the one-call C++ layer loop; the decoder runs its Python loop."""
        return None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] float32, expert ids [T, k]) of each token's top-k experts. The router's
        product is summed in float64 and rounded to float32: a BLAS sums a row in an order that
        depends on the row count, and in float32 those last-bit differences could pick another
        expert or weight once the batch changes; in float64 they stay far below float32's rounding,
        so a row routes the same whatever else is in the pass (the q4/q8 formats' batch invariance)."""
        logits = x.double() @ self.router
        if self.router_bias is not None:
            logits = logits + self.router_bias
        logits = logits.float()
        if self.softmax_after_topk:  # gpt-oss: the softmax of the chosen logits
            top, ids = logits.topk(self.top_k, dim=-1)
            return top.softmax(dim=-1), ids
        probs = logits.softmax(dim=-1)
        weights, ids = probs.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP's output for rows `x` [T, hidden] (any activation dtype), in float32."""
        t, hidden = x.shape
        weights, ids = self.route(x)
        out = self._one_row(x, weights, ids) if t == 1 else self._grouped(x, weights, ids)
        if self.shared is not None:
            shared = _mlp(self.shared, x, self.glu)
            if self.shared_gate is not None:
                shared = shared * torch.sigmoid(F.linear(x.double(), self.shared_gate)).float()
            out += shared
        return out

    def _one_row(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """A batch-1 decode step without the sort and scatter: the same products, weights and sums
        in the same (expert) order as `_grouped`, so the same bits where the kernels' rows are."""
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e, w in sorted(zip(ids[0].tolist(), weights[0].tolist())):
            out += _mlp(self.experts[e], x, self.glu) * w
        return out

    def _grouped(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        t, hidden = x.shape
        flat = ids.flatten()
        order = flat.argsort(stable=True)  # (token, expert) pairs grouped by expert
        token = order // self.top_k
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()
        xs = x[token]
        ys = torch.empty(len(order), hidden, dtype=torch.float32, device=x.device)
        start = 0
        for e, n in enumerate(counts):
            if n:
                ys[start : start + n] = _mlp(self.experts[e], xs[start : start + n], self.glu)
                start += n
        ys *= weights.flatten()[order].unsqueeze(1)
        return torch.zeros(t, hidden, dtype=torch.float32, device=x.device).index_add_(0, token, ys)


def silu_glu(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def clamped_swiglu(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss's gate (transformers' GptOssExperts._apply_gate, gate rows first here): gate clamped
    above at `limit`, up at +-limit, (up + 1) * gate * sigmoid(alpha * gate)."""
    gate, up = gate_up.chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def _mlp(pair: tuple, x: torch.Tensor, glu: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    gate_up, down = pair
    return down(glu(gate_up(x))).float()
