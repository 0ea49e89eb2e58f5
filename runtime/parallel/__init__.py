"""Tensor parallelism inside one replica (`--tensor-parallel-size N`, N in 1, 2, 4).

Rank 0 is the engine's own process: scheduler, radix cache, grammar masks and sampling stay there.
Ranks 1..N-1 are worker processes it spawns (launch.py, worker.py), joined in a torch.distributed
group without the global default group (group.py: gloo on CPU, NCCL on CUDA). Each rank holds its
slice of the weights (sharding.py: column-parallel q/k/v and gate/up, row-parallel o and down, the
vocabulary split) and its KV heads; every pass runs on every rank (model.py), with the batch sent
from rank 0 (messages.py). budget.py refuses a rank whose weights exceed --rank-memory-budget-mb.
"""
