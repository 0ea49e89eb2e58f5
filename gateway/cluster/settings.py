"""Cluster settings (`jumpgate serve --replicas N ...`), declared once like the other settings
objects; pure Python, so building the CLI never imports Ray."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from gateway.cluster.routing_policy import POLICIES
from runtime.settings_fields import check_settings, setting


@dataclass
class ClusterSettings:
    CLI_GROUP = "cluster (Ray Serve; needs the jumpgate[cluster] extra)"

    replicas: int | None = setting(
        None,
        "serve N engine replicas on Ray Serve behind a prefix-aware router",
        flag="--replicas",
        type=int,
        min=1,
        optional=True,
        metavar="N",
        default_text="off: one engine in this process, no Ray",
    )
    ray_address: str | None = setting(
        None,
        "attach to this Ray cluster",
        flag="--ray-address",
        optional=True,
        metavar="ADDRESS",
        default_text="start a local Ray instance",
    )
    replica_cpus: float = setting(1.0, "CPUs Ray reserves per replica", flag="--replica-cpus", min=0.0)
    replica_gpus: float = setting(0.0, "GPUs Ray reserves per replica", flag="--replica-gpus", min=0.0)
    gateway_replicas: int = setting(
        1,
        "gateway (ingress) replicas behind Ray Serve's HTTP proxy; each runs its own router",
        flag="--gateway-replicas",
        type=int,
        min=1,
    )
    gateway_cpus: float = setting(
        0.0,
        "CPUs Ray reserves per gateway replica (0: it shares the node with the engines)",
        flag="--gateway-cpus",
        min=0.0,
    )
    routing_policy: str = setting(
        "prefix", "how a replica is chosen (prefix: cache-aware)", flag="--routing-policy", choices=POLICIES
    )
    cache_threshold: float = setting(
        0.5,
        "least share of a prompt's blocks a replica must hold to be chosen by prefix",
        flag="--router-cache-threshold",
        min=0.0,
        max=1.0,
    )
    balance_abs_threshold: int = setting(
        32,
        "in-flight gap between replicas beyond which the least loaded is chosen",
        flag="--router-balance-abs-threshold",
        min=0,
    )
    balance_rel_threshold: float = setting(
        1.5,
        "load ratio beyond which (with the gap) the least loaded is chosen",
        flag="--router-balance-rel-threshold",
        min=1.0,
    )
    routing_stats_period_s: float = setting(
        1.0,
        "how often replicas report their prefix summary and stats",
        flag="--router-stats-period",
        above=0,
        metavar="SECONDS",
    )

    def __post_init__(self) -> None:
        check_settings(self)

    def router_kwargs(self) -> dict:
        return {
            "policy": self.routing_policy,
            "cache_threshold": self.cache_threshold,
            "balance_abs_threshold": self.balance_abs_threshold,
            "balance_rel_threshold": self.balance_rel_threshold,
        }


def with_shared_folders(engine, grammar):
    """The engine and grammar settings every replica gets, with the disk KV tier folder
    (`--disk-cache-dir`) and the compiled-grammar folder made absolute: a replica runs in another
    working directory, and all of them must open the same folders (docs/cluster.md)."""

    def absolute(path: str | None) -> str | None:
        return os.path.abspath(os.path.expanduser(path)) if path else path

    return (
        dataclasses.replace(engine, disk_cache_dir=absolute(engine.disk_cache_dir)),
        dataclasses.replace(grammar, cache_dir=absolute(grammar.cache_dir)),
    )
