"""Chaos for `python -m bench soak --cluster`: SIGKILL one Ray Serve replica of a `jumpgate serve
--replicas N` process every few seconds, as a crash would, and say when.

A replica is a Ray worker process whose title is `ray::ServeReplica:<app>:<deployment>`; it is found
among the descendants of the server process this bench started (the driver starts Ray, whose raylet
starts the workers), so nothing outside that tree is touched. Ray Serve notices the dead actor,
stops routing to it and starts a replacement (docs/cluster.md, "Faults").
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness.server_process import proc_stats


def descendants(root: int) -> list[int]:
    """Every process below `root` (by parent id), read from /proc."""
    children: dict[int, list[int]] = {}
    for pid, fields in proc_stats():
        children.setdefault(int(fields[1]), []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def replica_pids(root: int, deployment: str, app: str = "jumpgate") -> list[int]:
    title = f"ServeReplica:{app}:{deployment}"
    return [pid for pid in descendants(root) if title in cmdline(pid)]


@dataclass
class Kill:
    at: float  # time.monotonic()
    deployment: str
    pid: int


@dataclass(eq=False)  # a Thread: hashed by identity
class ReplicaKiller(threading.Thread):
    """Every `every_s` seconds, SIGKILL one replica of the next deployment in `targets` (in turn)."""

    server_pid: int
    every_s: float
    targets: tuple[str, ...] = ("engine",)
    seed: int = 0
    kills: list[Kill] = field(default_factory=list)
    skipped: int = 0  # a turn with no running replica of its deployment (all still restarting)

    def __post_init__(self) -> None:
        threading.Thread.__init__(self, name="replica-killer", daemon=True)
        self._halt = threading.Event()
        self._rng = random.Random(self.seed)

    def run(self) -> None:
        turn = 0
        while not self._halt.wait(self.every_s):
            self.kill_one(self.targets[turn % len(self.targets)])
            turn += 1

    def kill_one(self, deployment: str) -> Kill | None:
        """SIGKILL one running replica of `deployment`; None when there is none to kill."""
        pids = replica_pids(self.server_pid, deployment)
        if not pids:
            self.skipped += 1
            return None
        pid = self._rng.choice(pids)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            self.skipped += 1
            return None
        kill = Kill(time.monotonic(), deployment, pid)
        self.kills.append(kill)
        return kill

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)

    def kill_near(self, started: float, ended: float, window_s: float) -> Kill | None:
        """The latest kill that a request running from `started` to `ended` (monotonic) may have met
        on its replica: one inside it, or shortly before it began (the router learns late); else None."""
        return next((k for k in reversed(self.kills) if started - window_s <= k.at <= ended), None)
