"""`python -m bench fidelity --classify`: strict mode's verdict on the whole corpus, without a model.

Whether strict mode answers a schema is decided at compile time, so it can be measured on every
corpus schema (bench/fidelity/corpus.py) without generating anything. For each schema this runs
what the server runs for a strict `json_schema` request (grammar/service/service.py, then
gateway/pipeline/output_validation.py):

1. `validate_spec`: meta-schema, `$ref`s, regexes xgrammar cannot parse, the size limit (a 400
   `invalid_schema`; its keyword is the last token of the error's pointer, or `size`);
2. `spec_fidelity` (routing and check-and-roll-back included, as `--value-retries` says): the
   engine, and the keywords strict mode refuses;
3. for a schema routed to llguidance, llguidance's compile with the model's tokenizer (with
   `--tokenizer`; routing already validated the grammar without one); with `--compile`, xgrammar's
   compile of the others (against an empty vocabulary: a compile error does not depend on it).

Output: one JSON line per source and one for the total: `count`, `by_xgrammar`, `by_llguidance`,
`refused` (and `refused_frac`), `invalid_schema` (refused before the fidelity report), and
`refused_keywords`, a histogram of the keywords that refuse (a schema counts once per keyword).
With `--details`, one `kind: "refused"` line per refused schema.

  python -m bench fidelity --classify [--sources a,b] [--per-source N] [--details] [--tokenizer] [--compile]
                                     [--value-retries N]
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from bench.fidelity.corpus import SOURCES, Entry, build_corpus, select
from bench.harness.common import emit
from grammar.checks.rollback import DEFAULT_VALUE_RETRIES
from grammar.errors import GrammarSpecError
from grammar.spec import GrammarSpec
from grammar.validate import validate_spec
from grammar.validation.fidelity import LLGUIDANCE, XGRAMMAR, spec_fidelity


@dataclass
class Verdict:
    engine: str | None  # XGRAMMAR / LLGUIDANCE when strict mode answers it; None when refused
    keywords: list[str] = field(default_factory=list)  # what refuses it
    stage: str | None = None  # invalid_schema | strict | compile
    message: str | None = None


def _keyword_of(error: GrammarSpecError) -> str:
    if "byte limit" in error.message:
        return "size"
    tokens = [t for t in (error.pointer or "").split("/") if t]
    keyword = tokens[-1] if tokens else "schema"
    if len(tokens) >= 2 and tokens[-2] in ("patternProperties", "required"):  # a name or an index, not a keyword
        keyword = tokens[-2]
    return keyword


class Classifier:
    def __init__(
        self, llg_tokenizer: Any = None, xgrammar_compile: bool = False, value_retries: int = DEFAULT_VALUE_RETRIES
    ) -> None:
        self.llg_tokenizer = llg_tokenizer
        self.value_retries = value_retries
        self.compiler = None
        if xgrammar_compile:
            import xgrammar as xgr

            self.compiler = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)

    def verdict(self, schema: Any) -> Verdict:
        spec = GrammarSpec("json_schema", schema, True)
        try:
            validate_spec(spec)
        except GrammarSpecError as e:
            return Verdict(None, [_keyword_of(e)], "invalid_schema", e.message[:200])
        report = spec_fidelity(spec.kind, spec.payload, spec.strict, self.value_retries)
        refused = report.refused_in_strict
        if refused:
            return Verdict(
                None,
                sorted({k.keyword for k in refused}),
                "strict",
                "; ".join(f"{k.keyword} at {k.pointer}" for k in refused)[:300],
            )
        try:
            self._compile(spec, report.engine)
        except Exception as e:  # noqa: BLE001 - any compile failure is a refusal
            return Verdict(None, [f"compile:{report.engine}"], "compile", str(e)[:200])
        return Verdict(report.engine)

    def _compile(self, spec: GrammarSpec, engine: str) -> None:
        if engine == LLGUIDANCE and self.llg_tokenizer is not None:
            from grammar.engines.llguidance.matcher import compile_llguidance
            from grammar.engines.llguidance.schema import llguidance_grammar

            compile_llguidance(
                self.llg_tokenizer, llguidance_grammar(spec.payload, strict=True), "JSON schema", spec.param
            )
        elif engine == XGRAMMAR and self.compiler is not None:
            from grammar.service.compile import compile_spec

            compile_spec(self.compiler, spec)


def summarize(verdicts: list[Verdict]) -> dict[str, Any]:
    n = len(verdicts)
    refused = [v for v in verdicts if v.engine is None]
    keywords = Counter(k for v in refused for k in v.keywords)
    return {
        "count": n,
        "by_xgrammar": sum(v.engine == XGRAMMAR for v in verdicts),
        "by_llguidance": sum(v.engine == LLGUIDANCE for v in verdicts),
        "refused": len(refused),
        "refused_frac": round(len(refused) / n, 4) if n else None,
        "invalid_schema": sum(v.stage == "invalid_schema" for v in refused),
        "refused_keywords": dict(keywords.most_common()),
    }


def _llg_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from grammar.engines.llguidance.tokenizer import LLGuidanceTokenizer
    from runtime.model.loader import read_config, resolve_model_dir

    folder = resolve_model_dir()
    hf = AutoTokenizer.from_pretrained(str(folder))
    return LLGuidanceTokenizer(hf, read_config(folder).vocab_size, [hf.eos_token_id]).get()


def run(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench fidelity --classify", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sources", default=",".join(SOURCES))
    ap.add_argument("--per-source", type=int, default=None, help="at most N schemas per source, spread evenly")
    ap.add_argument("--details", action="store_true", help="one line per refused schema")
    ap.add_argument("--tokenizer", action="store_true", help="compile llguidance's grammars with the model's tokenizer")
    ap.add_argument("--compile", action="store_true", help="compile xgrammar's grammars (empty vocabulary)")
    ap.add_argument(
        "--value-retries",
        type=int,
        default=DEFAULT_VALUE_RETRIES,
        help="as the server's flag: 0 leaves check-and-roll-back out (the mask alone)",
    )
    args = ap.parse_args(list(argv or []))

    corpus, stats = build_corpus([s.strip() for s in args.sources.split(",") if s.strip()])
    sources = [s for s in stats if stats[s].available]
    entries: list[Entry] = select(corpus, sources, args.per_source, None)
    classifier = Classifier(_llg_tokenizer() if args.tokenizer else None, args.compile, args.value_retries)
    verdicts = [classifier.verdict(e.schema) for e in entries]
    for source in sources:
        mine = [v for e, v in zip(entries, verdicts) if e.source == source]
        emit({"bench": "fidelity_classify", "kind": "source", "source": source, **summarize(mine)})
    emit({"bench": "fidelity_classify", "kind": "total", **summarize(verdicts)})
    if args.details:
        for e, v in zip(entries, verdicts):
            if v.engine is None:
                emit(
                    {
                        "bench": "fidelity_classify",
                        "kind": "refused",
                        "source": e.source,
                        "name": e.name,
                        "stage": v.stage,
                        "keywords": v.keywords,
                        "message": v.message,
                    }
                )
