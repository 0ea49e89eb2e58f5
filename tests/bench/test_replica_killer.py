"""bench/harness/replica_killer.py, the chaos of `python -m bench soak --cluster`, against a real process
tree standing in for Ray's: workers titled as Ray Serve titles its replicas, under the process the
bench started. The killer must find them there, kill only the deployment it is asked for, and
attribute a failure to a kill only when the kill could have caused it."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from bench.harness.replica_killer import Kill, ReplicaKiller, cmdline, replica_pids

TREE = (
    "(exec -a ray::ServeReplica:jumpgate:engine sleep 600) & "
    "(exec -a ray::ServeReplica:jumpgate:engine sleep 600) & "
    "(exec -a ray::ServeReplica:jumpgate:gateway sleep 600) & wait"
)


def wait_for(predicate, what: str):
    for _ in range(200):  # a bound, not a timing assertion: bash needs a moment to exec its children
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(what)


def test_kills_one_replica_of_the_named_deployment_inside_the_tree():
    root = subprocess.Popen(["bash", "-c", TREE], start_new_session=True)
    outsider = subprocess.Popen(["bash", "-c", "exec -a ray::ServeReplica:jumpgate:engine sleep 600"])
    try:
        # all three exec'd: until it has, a subshell's command line is bash's, which names every
        # title (read too early, the gateway was missing or a subshell counted as a replica: CI failed once)
        def titled():
            engines, gateways = replica_pids(root.pid, "engine"), replica_pids(root.pid, "gateway")
            done = len(engines) == 2 and len(gateways) == 1
            return (
                (engines, gateways)
                if done and all(cmdline(p).startswith("ray::") for p in engines + gateways)
                else None
            )

        engines, gateways = wait_for(titled, "two engine replicas and a gateway")
        assert len(gateways) == 1 and outsider.pid not in engines  # only the tree below root
        killer = ReplicaKiller(root.pid, every_s=3600, targets=("engine",))
        kill = killer.kill_one("engine")
        assert kill is not None and kill.pid in engines and kill.deployment == "engine"
        wait_for(
            lambda: replica_pids(root.pid, "engine") == [p for p in engines if p != kill.pid], "the killed engine gone"
        )
        assert replica_pids(root.pid, "gateway") == gateways and outsider.poll() is None
        assert killer.kill_one("nothing-of-that-name") is None and killer.skipped == 1
    finally:
        os.killpg(root.pid, signal.SIGKILL)  # root leads its own group: bash and its children
        outsider.kill()
        root.wait()
        outsider.wait()


def test_a_failure_is_the_kills_doing_only_near_a_kill():
    killer = ReplicaKiller(server_pid=1, every_s=3600)
    engine, gateway = Kill(at=100.0, deployment="engine", pid=2), Kill(at=200.0, deployment="gateway", pid=3)
    killer.kills += [engine, gateway]
    assert killer.kill_near(started=90.0, ended=105.0, window_s=30) is engine  # running when it died
    assert killer.kill_near(started=120.0, ended=121.0, window_s=30) is engine  # routed before the router learnt
    assert killer.kill_near(started=140.0, ended=150.0, window_s=30) is None  # long after
    assert killer.kill_near(started=10.0, ended=99.0, window_s=30) is None  # over before it
    assert killer.kill_near(started=95.0, ended=210.0, window_s=30) is gateway  # the latest it met
