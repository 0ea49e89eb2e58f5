"""The grammar service's counters (a snapshot of them is what `GrammarService.stats()` returns)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GrammarServiceStats:
    memory_hits: int = 0
    disk_hits: int = 0
    disk_loaded: int = 0  # grammars read from disk into memory at start-up (warm_from_disk)
    misses: int = 0  # compiles started (neither memory nor disk had the key)
    compile_errors: int = 0  # specs refused (validation or xgrammar)
    compile_timeouts: int = 0
    compile_memory_errors: int = 0  # compiles past the memory limit (or whose process died)
    compile_seconds_total: float = 0.0
    compile_seconds_max: float = 0.0
    memory_entries: int = 0
    memory_bytes: int = 0
    compile_processes_replaced: int = 0  # compile processes killed or dead, and started again
    # compiles done in-process because the compile process could not send the grammar back
    # (serializing it needed too much memory or time); such grammars are never on disk
    compile_unserializable: int = 0

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)
