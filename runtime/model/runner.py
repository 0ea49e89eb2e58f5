"""The model runner: device memory and forward passes (nano-vllm's ModelRunner).

Builds the model, the KV pool, the req-to-token table, the attention backend and the CUDA graphs;
turns a scheduled plan into a `ForwardBatch`, runs it (replaying a CUDA graph when one fits,
eagerly otherwise) and says which logits rows belong to which request; copies only the rows still
needed to the host.

Ownership: runs on the engine thread only. It allocates each pass's KV slots and writes them into
the requests' rows; `Req.pass_end` marks them until decoding accounts for them (the cache manager
frees them if the step fails before that).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from runtime.attention import make_attention_backend
from runtime.attention.cascade import find_prefix_groups
from runtime.attention.cpu_backend import tile_precision
from runtime.engine_config import EngineConfig
from runtime.forward_batch import ForwardBatch
from runtime.kvcache.pool import KVPool, ReqToTokenTable
from runtime.kvcache.window_pool import default_window_slots, min_window_slots, window_batch
from runtime.model.config import ModelConfig, ModelLoadError
from runtime.model.decoder import load_model
from runtime.parallel.budget import check_weight_budget
from runtime.request import Req

log = logging.getLogger("jumpgate.engine")

CUDA_KV_FRACTION = 0.85  # of the device memory free once the weights are loaded
CUDA_RESERVE_BYTES = 2 << 30  # activations, logits, CUDA-graph pools


def default_pool_tokens(bytes_per_token: int, device: torch.device) -> int:
    """KV pool size when none is given. CUDA: most of the device memory left after the weights
    (as SGLang's static memory fraction does). CPU: 15% of available host memory, within
    4k..64k tokens (the CPU attention gathers each request's K/V, so a bigger pool buys little)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        budget = free * CUDA_KV_FRACTION - CUDA_RESERVE_BYTES
        return int(max(4096, budget // bytes_per_token))
    try:
        with open("/proc/meminfo") as f:
            avail_kb = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable"))
        budget = avail_kb * 1024 * 0.15
    except (OSError, StopIteration):
        budget = 2 << 30
    return int(max(4096, min(65536, budget // bytes_per_token)))


def window_kv_slots(cfg: EngineConfig, mc: ModelConfig, full_slots: int) -> int:
    """The window layers' own KV slots (runtime/kvcache/window_pool.py); 0: every layer keeps
    every position (no window layers, --window-kv-tokens 0, or auto where it would save nothing
    or is not supported)."""
    windows = [w for w in mc.layer_windows if w]
    asked = cfg.window_kv_tokens
    if not windows or asked == 0:
        return 0
    if asked is None and len(windows) == mc.num_layers:
        # every layer windowed (Mistral v0.1, Phi-3): the window pool would hold all K/V, so a quarter
        # of the pool would cut the context held at once by 4x for every request shorter than the window
        return 0
    unsupported = (
        "tensor parallelism (--tensor-parallel-size)"
        if cfg.tensor_parallel_size > 1
        else "the host and disk KV tiers (--host-pool-tokens)"
        if cfg.host_pool_tokens
        else None
    )
    if unsupported is not None:
        if asked is None:
            return 0
        raise ModelLoadError(
            f"--window-kv-tokens {asked}: a window-layer KV pool does not work with {unsupported} yet; set 0"
        )
    window = max(windows)
    pass_tokens = max(cfg.chunked_prefill_tokens, 1 + cfg.max_jump_forward_tokens + cfg.speculative_tokens)
    need = min_window_slots(window, pass_tokens)
    if asked is None:
        auto = default_window_slots(full_slots, need)
        return auto if need <= auto < full_slots else 0  # no smaller than the full pool: nothing to save
    if asked < need:
        raise ModelLoadError(
            f"--window-kv-tokens {asked}: one request needs {need} window slots "
            f"(the window {window}, {need - window} for the slack and one pass's new tokens)"
        )
    return min(asked, full_slots)


def pick_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def pick_dtype(requested: str, device: torch.device) -> torch.dtype:
    name = requested if requested != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    return getattr(torch, name)


@dataclass
class LogitsRows:
    """Where one planned request's logits are in a pass's output."""

    req: Req
    first_row: int  # -1: none (a prefill chunk that does not reach the end of the prompt)
    num_rows: int  # the last real token's row, then one per draft token
    fed: int  # tokens this pass fed for the request


@dataclass
class PassOutput:
    logits: torch.Tensor  # [sum of num_rows, vocab], on the device
    rows: list[LogitsRows]  # one per planned request, in plan order


class ModelRunner:
    def __init__(
        self,
        cfg: EngineConfig,
        model_dir: Path,
        mc: ModelConfig,
        device: torch.device,
        dtype: torch.dtype,
        max_context: int,
    ):
        self.device, self.dtype = device, dtype
        # before the model: `auto` weights are q4 only under batch-invariant attention (runtime/model/weight_format.py)
        self.attn = make_attention_backend(cfg.attention_backend, device)
        if mc.attention_sinks and not self.attn.supports_sinks:  # gpt-oss
            raise ModelLoadError(
                f"{model_dir}: {mc.model_type} needs attention sinks, which the {self.attn.name} attention backend "
                "does not have; use --attention-backend torch"
            )
        self.tp = None  # rank 0 of a tensor-parallel group (runtime/parallel/): its workers
        if cfg.tensor_parallel_size > 1:
            from runtime.parallel.launch import TensorParallel

            self.tp = TensorParallel(cfg, model_dir, mc, device, dtype)
        try:
            self._build(cfg, model_dir, mc, device, dtype, max_context)
        except BaseException:
            self.close()
            raise

    def _build(self, cfg, model_dir, mc, device, dtype, max_context) -> None:
        if self.tp is None:
            self.model = load_model(
                model_dir,
                mc,
                cfg.weights,
                device,
                dtype,  # .weights / .weights_reason: which, why
                invariant_attention=self.attn.batch_invariant,
            )
        else:
            from runtime.parallel.model import load_sharded_model

            self.model = load_sharded_model(model_dir, mc, cfg.weights, device, dtype, self.tp.group)
        size = cfg.tensor_parallel_size
        check_weight_budget(self.model, cfg.rank_memory_budget_mb, 0, size)
        # the kernel's float32 passes only (other dtypes go through torch)
        tiles = (
            cfg.attention_tiles != "off"
            and dtype == torch.float32
            and self.attn.enable_tiles(self.model.weights, tile_precision(cfg.attention_precision))
        )
        if cfg.attention_tiles == "on" and not tiles:
            log.warning(
                "--attention-tiles: not used (it takes the cpu attention backend, q4, q8 or bf16 weights, "
                "float32 activations and a CPU with AMX, or AVX512-BF16 at bf16 precision; here %s attention, "
                "%s weights, %s)",
                self.attn.name,
                self.model.weights,
                dtype,
            )
        kv_heads = mc.num_kv_heads // size  # under tensor parallelism each rank holds its heads' K/V
        bpt = KVPool.bytes_per_token(mc.num_layers, kv_heads, mc.head_dim, dtype)
        self.kv_pool_tokens = cfg.kv_pool_tokens or default_pool_tokens(bpt, device)
        self.kv = KVPool(
            mc.num_layers,
            self.kv_pool_tokens,
            kv_heads,
            mc.head_dim,
            dtype,
            device,
            head_major=self.attn.kv_head_major,
            layer_windows=mc.layer_windows,
            window_slots=window_kv_slots(cfg, mc, self.kv_pool_tokens),
        )
        self.attn_window = None  # the window layers' own plan of each pass, over their window slots
        if self.kv.window is not None:
            self.attn_window = make_attention_backend(cfg.attention_backend, device)
            if tiles:
                self.attn_window.enable_tiles(self.model.weights, tile_precision(cfg.attention_precision))
        self.req_table = ReqToTokenTable(cfg.max_running_requests, max_context + cfg.max_jump_forward_tokens + 2)
        # shared-prefix groups are built only for a backend that reads them
        self.cascade = cfg.cascade_attention and self.attn.supports_prefix_groups
        if self.tp is not None:
            self.tp.start(self.kv_pool_tokens)  # the workers' pools: the same slots, their heads
        self.cuda_graphs = None  # decode passes replayed from CUDA graphs (CUDA + triton only, one rank)
        graphs = cfg.cuda_graphs and self.tp is None and self.attn.name == "triton" and self.model.graph_capturable
        graphs = graphs and self.kv.window is None  # the graphs read every layer's K/V by full slot
        if graphs and device.type == "cuda":
            from runtime.model.cuda_graphs import DecodeCudaGraphs

            self.cuda_graphs = DecodeCudaGraphs(
                self.model, self.kv, cfg.max_running_requests, self.req_table.table.shape[1]
            )

    def run(self, plan: list[tuple[Req, int]]) -> PassOutput:
        """One forward pass over `n` new tokens of each planned request (their slots were
        reserved by the scheduler). A request whose pending tokens all go in gets logits rows for
        its last real token and each draft token."""
        ids, positions, out_slots, ext_lens, seq_lens, slot_rows, logits_index = [], [], [], [], [], [], []
        rows: list[LogitsRows] = []
        offset = 0
        for r, n in plan:
            slots = self.kv.allocator.alloc(n)
            assert slots is not None, "slots were reserved before the pass"
            self.req_table.write(r.row, r.kv_len, slots)
            r.pass_end = r.kv_len + n
            ids.extend(r.pending_ids(n))
            positions.extend(range(r.kv_len, r.kv_len + n))
            out_slots.append(slots)
            ext_lens.append(n)
            seq_lens.append(r.kv_len + n)
            slot_rows.append(self.req_table.slots(r.row, r.kv_len + n))
            if n == r.num_pending:
                k = len(r.draft) + 1
                rows.append(LogitsRows(r, len(logits_index), k, n))
                logits_index.extend(range(offset + n - k, offset + n))
            else:
                rows.append(LogitsRows(r, -1, 0, n))
            offset += n
        batch = ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.int64, device=self.device),
            positions=torch.tensor(positions, dtype=torch.int64, device=self.device),
            # on the model's device: every layer indexes its K/V pool with it
            out_slots=torch.cat(out_slots).to(self.device, non_blocking=True),
            extend_lens=ext_lens,
            seq_lens=seq_lens,
            slot_rows=slot_rows,
            logits_index=torch.tensor(logits_index, dtype=torch.int64, device=self.device),
        )
        if self.cascade and len(plan) > 1:
            batch.prefix_groups = find_prefix_groups(
                ext_lens, seq_lens, slot_rows, self.attn.max_short_extend, min_saved=self.attn.min_saved_prefix_reads
            )
        # Always run the pass, even when no row's logits are wanted (a pass of only mid-prompt
        # prefill chunks): the forward is what writes this pass's K/V into the pool.
        return PassOutput(self.forward(batch), rows)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """The logits of one pass (its K/V written into the pool): a CUDA graph's replay where one
        fits, on every tensor-parallel rank where there are several, else this model's forward."""
        if self.cuda_graphs is not None and self.cuda_graphs.can_run(batch):
            return self.cuda_graphs.run(batch)
        if self.tp is not None:  # the workers run the same pass on their shards
            return self.tp.run_pass(batch, lambda: self.model.forward(batch, self.kv, self.attn))
        if self.kv.window is not None:
            return self.model.forward(
                batch, self.kv, self.attn, (window_batch(batch, self.kv.window), self.attn_window)
            )
        return self.model.forward(batch, self.kv, self.attn)

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any (idempotent)."""
        if self.tp is not None:
            self.tp.close()

    @staticmethod
    def rows_to_host(out: PassOutput, chosen: dict[str, int]) -> tuple[torch.Tensor | None, dict[str, int]]:
        """The logits rows still to be read one by one (draft verification, sampling: requests
        not in `chosen`, the greedy choices already made on the device), on the host, and where
        each request's rows start there. A greedy decode batch copies nothing (on CUDA the whole
        [B, vocab] logits would be megabytes per step). On the CPU nothing is copied: each request's
        rows are read in place, a slice of the pass's logits."""
        if out.logits.device.type == "cpu":
            return out.logits, {w.req.rid: w.first_row for w in out.rows if w.first_row >= 0}
        at: dict[str, int] = {}
        index: list[int] = []
        for w in out.rows:
            if w.first_row >= 0 and (w.num_rows > 1 or w.req.rid not in chosen):
                at[w.req.rid] = len(index)
                index.extend(range(w.first_row, w.first_row + w.num_rows))
        logits = out.logits
        if index:
            return logits[torch.tensor(index, device=logits.device)].cpu(), at
        return None, at
