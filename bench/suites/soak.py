"""`python -m bench soak`: many concurrent clients against a server with a small KV pool.

Starts `jumpgate serve --kv-pool-tokens 4096` with the host and disk KV tiers on (the disk tier in
a temp folder) and, for a bounded time (default 120 s, --quick 40 s), runs 64 concurrent clients.
Each client repeatedly picks: 20% a valid request it hangs up on part-way (after a few SSE events,
or while still queued), 10% a bad request (malformed JSON, wrong types, unknown model or schema id,
invalid schema or regex, missing tool, oversized body, ...), and otherwise a valid request whose
output is checked against its schema: agent-tools (short system prompt + the 8 tools of
schemas/agent_tools.json, tool_choice "required", one call, streamed), json-extract (a shared
document, a 5-field strict schema, streamed or not), a registry upload (POST /v1/schemas of a
schema no other upload has, then a request naming it by `schema_id`, streamed or not) or a stored
response (/v1/responses, strict json_schema, store: true). A background thread hits /health every
100 ms and samples the server's RSS. At the deadline the requests still in flight are cancelled
(one more wave of disconnects), the server is given time to go idle, /metrics is read for slots
left behind, and every acknowledged upload and stored response is read back.

`--cluster` runs the same clients against `jumpgate serve --replicas 2` on Ray Serve (the gateway
replicas share the registry and responses folders, the engines the grammar cache and disk tier)
and SIGKILLs one replica every `--kill-every` seconds (`bench/harness/replica_killer.py`): a request that
fails with the clear 503 `engine_stopped` (`gateway_stopped` for a gateway replica) while a replica died under it counts as
`killed_in_flight`; any other failure is a server error.

One JSON line: requests, completed_ok, server_errors (5xx or an error event in a stream),
invalid_outputs, leaked_slots (KV slots held only by requests once idle), running_after_idle,
rss_growth_mb (mean RSS over the last third of the run minus the mean over the second third),
p99_health_ms, uploads_lost / responses_lost (acknowledged, not readable at the end), and the counts
behind them.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import httpx

from bench.harness.chat_workloads import (
    exit_on_sigterm,
    percentile,
    stream_chat,
)
from bench.harness.common import emit
from bench.harness.replica_killer import ReplicaKiller, descendants
from bench.harness.server_process import JumpgateServer
from bench.harness.soak_clients import Soak


# json-extract in the soak: the first five fields of tests/data/schema_corpus/extract_12_fields.json,
# with bounded strings, so that a request can finish while 63 others share the CPU.
class Poller(threading.Thread):
    """/health every `interval` s (latency in ms) and the server's RSS once a second."""

    def __init__(self, server: JumpgateServer, rss: Any, interval: float = 0.1):
        super().__init__(name="soak-poller", daemon=True)
        self.server = server
        self.rss_mb = rss
        self.interval = interval
        self.health_ms: list[float] = []
        self.health_failures = 0
        self.rss: list[tuple[float, float]] = []  # (monotonic time, MB)
        self._halt = threading.Event()

    def run(self) -> None:
        last_rss = 0.0
        with httpx.Client(base_url=self.server.url, timeout=5.0) as client:
            while not self._halt.is_set():
                t0 = time.perf_counter()
                try:
                    ok = client.get("/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                elapsed = time.perf_counter() - t0
                if ok:
                    self.health_ms.append(elapsed * 1000.0)
                else:
                    self.health_failures += 1
                now = time.monotonic()
                if now - last_rss >= 1.0:
                    self.rss.append((now, self.rss_mb()))
                    last_rss = now
                self._halt.wait(max(0.0, self.interval - elapsed))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)


def tree_rss_mb(root: int) -> float:
    """Resident memory of `root` and every process below it (with --cluster: Ray and its replicas)."""
    total = 0.0
    for pid in [root, *descendants(root)]:
        try:
            with open(f"/proc/{pid}/status") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0) / 1024.0
        except OSError:
            pass
    return total


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def parse_args(quick: bool, argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench soak", description="soak test of the HTTP server")
    ap.add_argument("--duration", type=float, default=40.0 if quick else 120.0, help="seconds of load")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--kv-pool-tokens", type=int, default=4096)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument(
        "--max-running-requests",
        type=int,
        default=16,
        help="the server's batch limit; the other clients wait in its queue (a 2-core CPU cannot "
        "finish anything with 64 long-context requests decoding side by side in 40 s)",
    )
    ap.add_argument("--disconnect-frac", type=float, default=0.2)
    ap.add_argument("--bad-frac", type=float, default=0.1)
    ap.add_argument("--request-timeout", type=float, default=600.0)
    ap.add_argument("--idle-timeout", type=float, default=60.0, help="seconds to wait for the server to go idle")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--upload-frac",
        type=float,
        default=0.2,
        help="share of valid requests that upload a new schema and then use it by id",
    )
    ap.add_argument(
        "--responses-frac",
        type=float,
        default=0.15,
        help="share of valid requests that are stored /v1/responses (read back at the end)",
    )
    ap.add_argument("--host-pool-tokens", type=int, default=8192, help="host KV tier (0: tiers off)")
    ap.add_argument("--no-disk-tier", action="store_true", help="no disk KV tier (it is on, in a temp folder)")
    ap.add_argument(
        "--cluster",
        action="store_true",
        help="two engine replicas on Ray Serve, one killed every --kill-every s (chaos)",
    )
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument(
        "--gateway-replicas",
        type=int,
        default=2,
        help="--cluster: gateway replicas (they share the registry and responses folders)",
    )
    ap.add_argument("--kill-every", type=float, default=20.0 if quick else 120.0)
    ap.add_argument(
        "--kill", default="engine", help="--cluster: deployments whose replicas are killed in turn (engine, gateway)"
    )
    ap.add_argument(
        "--kill-window",
        type=float,
        default=90.0,
        help="--cluster: seconds after a kill during which engine_stopped is the kill's doing",
    )
    return ap.parse_args(list(argv or []))


def run(quick: bool = False, argv: Sequence[str] | None = None) -> None:
    args = parse_args(quick, argv)
    exit_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="jumpgate-soak-") as tmp:
        server = JumpgateServer(
            Path(tmp),
            kv_pool_tokens=args.kv_pool_tokens,
            startup_timeout_s=600,
            extra_args=server_args(args, Path(tmp)),
        )
        with server:
            soak = Soak(server.url, args)

            # warm-up outside the measured window: compile both grammars once
            async def warm() -> None:
                async with httpx.AsyncClient(base_url=server.url, timeout=600) as client:
                    rng = random.Random(1)
                    kinds = set()
                    while len(kinds) < 2:
                        kind, body = soak.valid_body(rng)
                        if kind not in kinds:
                            kinds.add(kind)
                            await stream_chat(client, {**body, "max_tokens": args.max_tokens})

            asyncio.run(warm())

            poller = Poller(server, rss=(lambda: tree_rss_mb(server.pid)) if args.cluster else server.rss_mb)
            if args.cluster:
                soak.killer = ReplicaKiller(server.pid, args.kill_every, tuple(args.kill.split(",")), seed=args.seed)
            t_start = time.monotonic()
            poller.start()
            if soak.killer is not None:
                soak.killer.start()
            asyncio.run(soak.run(t_start + args.duration))
            t_end = time.monotonic()
            if soak.killer is not None:
                soak.killer.stop()
            after = server.wait_metrics(timeout_s=args.idle_timeout, interval_s=0.25)
            idle_wait = time.monotonic() - t_end
            asyncio.run(soak.read_back())
            poller.stop()
            rss_final = poller.rss_mb()

    third = (t_end - t_start) / 3.0
    second = [mb for t, mb in poller.rss if t_start + third <= t < t_start + 2 * third]
    last = [mb for t, mb in poller.rss if t_start + 2 * third <= t <= t_end]
    m2, m3 = mean(second), mean(last)
    c = soak.c
    emit(
        {
            "bench": "soak",
            "mode": "cluster" if args.cluster else "single",
            "duration_s": t_end - t_start,
            "clients": args.clients,
            "kv_pool_tokens": args.kv_pool_tokens,
            "max_running_requests": args.max_running_requests,
            "requests": c.requests,
            "completed_ok": c.completed_ok,
            "server_errors": c.server_errors,
            "invalid_outputs": c.invalid_outputs,
            "leaked_slots": int(after.get("jumpgate_kv_slots_request_only", -1)),
            "running_after_idle": int(after.get("jumpgate_running_requests", -1)),
            "waiting_after_idle": int(after.get("jumpgate_waiting_requests", -1)),
            "in_flight_after_idle": int(after.get("jumpgate_gateway_in_flight_requests", -1)),
            "idle_wait_s": idle_wait,
            "rss_growth_mb": (m3 - m2) if m2 is not None and m3 is not None else None,
            "rss_mb_end": rss_final,
            "p99_health_ms": percentile(poller.health_ms, 0.99),
            "p50_health_ms": percentile(poller.health_ms, 0.5),
            "max_health_ms": max(poller.health_ms) if poller.health_ms else None,
            "health_checks": len(poller.health_ms),
            "health_failures": poller.health_failures,
            "valid_requests": c.valid_requests,
            "incomplete_length": c.incomplete,
            "disconnects": c.disconnects,
            "bad_requests": c.bad_requests,
            "bad_rejected_ok": c.bad_rejected_ok,
            "bad_accepted": c.bad_accepted,
            "client_errors": c.client_errors,
            "transport_errors": c.transport_errors,
            "cancelled_at_end": c.cancelled_at_end,
            "tokens_generated": int(after.get("jumpgate_generation_tokens_total", 0)),
            "retractions": int(after.get("jumpgate_engine_retractions", 0)),
            "non_streamed": c.non_streamed,
            "uploads": c.uploads,
            "uploads_acknowledged": c.uploads_acknowledged,
            "uploads_lost": c.uploads_lost,
            "responses_stored": c.responses_stored,
            "responses_lost": c.responses_lost,
            "disk_tier": not args.no_disk_tier and args.host_pool_tokens > 0,
            "host_pool_tokens": args.host_pool_tokens,
            "disk_tier_counts": {k: int(v) for k, v in after.items() if "disk_pages" in k or "disk_corrupt" in k},
            **(
                {
                    "replicas": args.replicas,
                    "gateway_replicas": args.gateway_replicas,
                    "kill_every_s": args.kill_every,
                    "kills": len(soak.killer.kills) if soak.killer else 0,
                    "kills_by_deployment": {
                        d: sum(k.deployment == d for k in soak.killer.kills) for d in args.kill.split(",")
                    }
                    if soak.killer
                    else {},
                    "kill_skipped": soak.killer.skipped if soak.killer else 0,
                    "killed_in_flight": c.killed_in_flight,
                    "killed_by_status": c.killed_by_status,
                }
                if args.cluster
                else {}
            ),
            "by_status": c.by_status,
            "error_samples": c.error_samples,
        }
    )


def server_args(args: argparse.Namespace, tmp: Path) -> list[str]:
    """The serve flags: batch limit, KV tiers (disk in `tmp`), room for every stored response, and
    with --cluster the replicas on Ray Serve (half a core each: the host has few)."""
    flags = [
        "--max-running-requests",
        str(args.max_running_requests),
        "--responses-max-stored",
        "1000000",
        "--responses-max-bytes",
        str(1 << 40),
    ]
    if args.host_pool_tokens:
        flags += ["--host-pool-tokens", str(args.host_pool_tokens)]
        if not args.no_disk_tier:
            flags += ["--disk-cache-dir", str(tmp / "kv-disk")]
    if args.cluster:
        flags += [
            "--replicas",
            str(args.replicas),
            "--replica-cpus",
            "0.5",
            "--gateway-replicas",
            str(args.gateway_replicas),
            "--num-threads",
            "1",
            "--router-stats-period",
            "1",
        ]
    return flags
