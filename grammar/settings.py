"""Grammar-service settings: each field declared once with its default, help and `jumpgate serve` flag."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from grammar.checks.rollback import DEFAULT_VALUE_RETRIES
from runtime.settings_fields import check_settings, setting


def cache_root() -> Path:
    """Where Jumpgate keeps its caches ($JUMPGATE_CACHE_DIR, else ~/.cache/jumpgate)."""
    return Path(os.environ.get("JUMPGATE_CACHE_DIR", Path.home() / ".cache" / "jumpgate"))


@dataclass
class GrammarSettings:
    CLI_GROUP = "grammar service"

    cache_dir: str | None = setting(
        None,
        "compiled grammar disk cache, reused after a restart",
        flag="--grammar-cache-dir",
        optional=True,
        metavar="DIR",
        default_text="$JUMPGATE_CACHE_DIR/grammars, else ~/.cache/jumpgate/grammars",
    )
    disk_cache: bool = setting(
        True, "keep compiled grammars in memory only", flag="--no-grammar-disk-cache", negative=True
    )
    disk_cache_mb: int = setting(
        1024,
        "compiled grammars kept on disk, in MB (least recently used files go first)",
        flag="--grammar-cache-disk-mb",
        min=1,
    )
    memory_mb: int = setting(
        512,
        "compiled grammars kept in memory, in MB (least recently used go first)",
        flag="--grammar-cache-memory-mb",
        min=1,
    )
    compile_timeout_s: float = setting(
        10.0, "seconds one grammar may take to compile", flag="--grammar-compile-timeout", above=0, metavar="SECONDS"
    )
    compile_memory_mb: int = setting(
        4096,
        "memory one grammar compile may use, in MB, beyond what its compile process holds idle "
        "(0: no limit); past it the schema is refused",
        flag="--grammar-compile-memory-mb",
        min=0,
    )

    value_retries: int = setting(
        DEFAULT_VALUE_RETRIES,
        "rewrites per output when a JSON schema keyword that no mask enforces is checked on the finished "
        "output (check-and-roll-back); 0: strict mode refuses such schemas",
        flag="--value-retries",
        min=0,
    )

    def __post_init__(self) -> None:
        check_settings(self)

    def cache_path(self) -> Path | None:
        """The disk cache folder, or None when the disk cache is off."""
        if not self.disk_cache:
            return None
        return Path(self.cache_dir) if self.cache_dir else cache_root() / "grammars"

    @property
    def compile_memory_bytes(self) -> int | None:
        return (self.compile_memory_mb << 20) or None

    @property
    def max_memory_bytes(self) -> int:
        return self.memory_mb << 20

    @property
    def max_disk_bytes(self) -> int:
        return self.disk_cache_mb << 20
