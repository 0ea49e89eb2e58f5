"""`python -m bench grammar`: what grammars cost and what they buy (in-process engine, greedy).

One JSON line per metric:
- mask_overhead: decode step time with a grammar mask / without, same batch, same step count
  (a free-string schema whose minLength keeps every request going; jump-forward off).
- jump_forward: tokens/s of `verify` and `direct` over `off` on a 12-field extraction workload
  (8 requests batched, strict, max_tokens 160), and forward passes per output token of each mode;
  also the first repetition alone (drafts with nothing learned yet) and the same extraction one
  request at a time (`batch1_*`).
- compile: cold compile p50 over the test corpus, then memory hits (same service) and disk hits
  (a new service on the same cache folder).
- completeness: share of complete / valid JSON on a loop-prone extraction workload without and
  with strict mode (closing + loop breaking), same run; and the decode step time with strict mode
  / without on a workload where neither fires (the outputs are then identical, which is checked).

Timings on a shared CPU are noisy: the timed runs alternate (A B A B ...) and medians are reported;
the `*_cpu` fields give the same ratios from the process's CPU time, which other processes on the
machine disturb less than wall time.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time

from bench.harness.common import emit, run_timed
from bench.harness.workloads import ROOT, chat
from grammar import GrammarService, GrammarSpec
from runtime.api import EngineStats, GenerateRequest
from runtime.decode.sampling import SamplingParams
from runtime.engine.engine import Engine

DATA = ROOT / "tests" / "data"
SYSTEM = "You are a JSON API. Reply with one compact JSON value only."

# Profiles for the extraction workloads (12-field person/company record).
PROFILES = [
    "Maria Okafor is Head of Data at Brightwave Analytics, a fintech firm headquartered in Lisbon "
    "(brightwave.io). Reach her at maria.okafor@brightwave.io or +351 21 555 0199. Skills: Python, SQL, "
    "forecasting. Speaks Portuguese and English. Previously at Unbabel and Farfetch. She built the "
    "company's first real-time risk platform.",
    "Kenji Watanabe works as a senior mechanical engineer for Hoshino Robotics (industrial automation, "
    "hoshino-robotics.jp), based in Osaka. Email kenji.w@hoshino-robotics.jp, phone +81 6 5555 0142. "
    "He knows CAD, FEA and PLC programming, speaks Japanese and German, and worked at Fanuc before. "
    "He designs grippers for food packaging lines.",
    "Dr. Amara Diallo, chief medical officer at Sahel Health Partners, a healthcare nonprofit in Dakar "
    "(sahelhealth.org). Contact: a.diallo@sahelhealth.org, +221 33 555 0176. Expertise in epidemiology, "
    "clinical trials and public policy; languages French, Wolof and English; formerly with MSF and WHO. "
    "Leads the regional malaria vaccine rollout.",
    "Lukas Brenner, product manager at Alpenrad GmbH (bicycles, alpenrad.de), Munich. "
    "lukas.brenner@alpenrad.de / +49 89 555 0113. Skills: roadmapping, user research, pricing. Speaks "
    "German, English and Italian. Previously at BMW and Komoot. Launched the e-cargo bike line.",
    "Sofia Herrera is a data journalist at La Voz Digital, a media company in Bogota (lavoz.co). "
    "Write to sofia.h@lavoz.co or call +57 1 555 0188. She uses R, D3 and PostgreSQL, speaks Spanish "
    "and English, and used to work at El Tiempo. Her work exposed a public contracting scandal.",
    "Ahmed Rahman, founder and CEO of GreenGrid Energy (renewables, greengrid.energy), Dhaka. "
    "ahmed@greengrid.energy, +880 2 555 0199. Skills: project finance, solar engineering, negotiation. "
    "Languages: Bengali, English, Hindi. Past employers: Grameenphone, Siemens. Built 40 solar "
    "micro-grids.",
    "Elena Petrova is a cloud architect at Nordlys Systems, an IT consultancy in Oslo (nordlys.no). "
    "Email elena.petrova@nordlys.no, phone +47 22 55 50 12. Skills: Kubernetes, Terraform, AWS, Go. "
    "Speaks Russian, Norwegian and English. Previously at Telenor and Schibsted. Migrated a bank to "
    "the cloud.",
    "Tomás Silva, sous chef at Casa do Mar, a restaurant group in Porto (casadomar.pt). "
    "tomas@casadomar.pt, +351 22 555 0134. Skills: seafood, pastry, menu costing. Languages: "
    "Portuguese, Spanish, French. Worked at Belcanto and Noma. Won a regional cooking award.",
]

# Small schemas and prompts the model answers well within budget (no closing, no loop breaking).
WELL_BEHAVED = [
    ("person_basic", "Extract the person: Ada Lovelace, 36, ada@example.com."),
    ("weather_report", "Report the weather: Oslo, 4 degrees, light rain, wind 20 km/h from the north."),
    ("address_nested", "Extract: Ann Lee lives at 1 Main St, Springfield, 12345, US."),
    ("enum_sentiment", "What is the sentiment of: 'The battery lasts two days and the screen is gorgeous.'"),
    ("boolean_flags", "Classify this message: 'Win a free cruise!!! Send your bank details to claim.'"),
    ("geojson_point", "Give the GeoJSON point for longitude 4.9, latitude 52.37."),
    ("movie_review", "Review the film 'Arrival': slow but moving, great score, 4 of 5."),
    ("calendar_event", "Create the event: team sync on 2024-05-02 from 10:00 to 10:30 UTC."),
]


def _schema(name: str) -> dict:
    return json.loads((DATA / "schema_corpus" / f"{name}.json").read_text())


def _greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0.0, **kw)


def _delta(engine: Engine, before: EngineStats) -> dict:
    after = engine.stats()
    return {
        k: getattr(after, k) - getattr(before, k)
        for k in (
            "forward_passes",
            "generated_tokens",
            "engine_seconds",
            "jump_forward_tokens",
            "jump_forward_rejected",
        )
    }


def _timed(engine: Engine, specs: list[GenerateRequest]) -> tuple[list, dict]:
    """Results and counter deltas; `cpu_s` is the process's CPU time over the run (engine thread
    and torch's threads; the caller only waits), steadier than wall time on a shared machine."""
    before, cpu0 = engine.stats(), time.process_time()
    results = engine.generate_many(specs, timeout=3600)
    delta = _delta(engine, before)
    delta["cpu_s"] = time.process_time() - cpu0
    return results, delta


def _median_ratio(pairs: list[tuple[float, float]]) -> float:
    return statistics.median(a / b for a, b in pairs)


def _complete(text: str, validator) -> tuple[bool, bool]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False, False
    return True, validator.is_valid(value)


# ---------------------------------------------------------------------------------------- metrics


def mask_overhead(engine: Engine, svc: GrammarService, quick: bool) -> dict:
    """Decode step time, grammar-masked / free, on the same prompts, batch and step count."""
    batch, steps, reps = (8, 16, 2) if quick else (8, 32, 7)
    tok = engine.tokenizer
    # minLength keeps the string open for the whole run, so no request finishes early
    handle = svc.compile(
        GrammarSpec.json_schema(
            {
                "type": "object",
                "properties": {"essay": {"type": "string", "minLength": 1000}},
                "required": ["essay"],
                "additionalProperties": False,
            }
        )
    )
    topics = ["rivers", "volcanoes", "bridges", "owls", "comets", "glaciers", "deserts", "lighthouses"]
    prompts = [
        chat(
            tok,
            [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Write a long essay about {t} as JSON."},
            ],
        )
        for t in topics[:batch]
    ]

    def specs(constrained: bool):
        return [
            GenerateRequest(
                p, _greedy(steps, ignore_eos=True), constraint=handle if constrained else None, jump_forward="off"
            )
            for p in prompts
        ]

    engine.generate_many([GenerateRequest(p, _greedy(1)) for p in prompts])  # prompts into the prefix cache
    pairs, cpu_pairs = [], []
    for i in range(reps):  # alternate which goes first (A B, B A, ...): no order effect
        if i % 2:
            _, masked = _timed(engine, specs(True))
            _, free = _timed(engine, specs(False))
        else:
            _, free = _timed(engine, specs(False))
            _, masked = _timed(engine, specs(True))
        assert masked["generated_tokens"] == free["generated_tokens"] == batch * steps
        pairs.append(
            (masked["engine_seconds"] / masked["forward_passes"], free["engine_seconds"] / free["forward_passes"])
        )
        cpu_pairs.append((masked["cpu_s"], free["cpu_s"]))
    ratio = _median_ratio(pairs)
    return {
        "metric": "mask_overhead",
        "ratio": ratio,
        "ratio_cpu": _median_ratio(cpu_pairs),
        "batch": batch,
        "steps": steps,
        "step_ms_masked": 1000 * statistics.median(a for a, _ in pairs),
        "step_ms_free": 1000 * statistics.median(b for _, b in pairs),
        "reps": reps,
    }


def jump_forward(engine: Engine, svc: GrammarService, quick: bool) -> dict:
    """12-field extraction, strict, max_tokens 160: tokens/s and forward passes per output token.

    `passes_per_token_*` is per request: the passes in which a request got output (one stream
    event each) over its output tokens, so `off` is 1.0 whatever the batch size.
    `batch_passes_per_token_*` is the engine's forward_passes / generated_tokens (the batch shares
    each pass)."""
    docs = PROFILES[:4] if quick else PROFILES
    max_tokens, reps = (160, 1) if quick else (160, 3)
    handle = svc.compile(GrammarSpec.json_schema(_schema("extract_12_fields")))
    prompts = [
        chat(
            engine.tokenizer,
            [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Extract the person and company record: {d}"},
            ],
        )
        for d in docs
    ]
    runs: dict[str, list[dict]] = {m: [] for m in ("off", "verify", "direct")}
    outputs: dict[str, list] = {}
    for _ in range(reps):
        for mode in runs:
            engine.flush_cache()  # zeroes the counters; every mode starts from the same cold cache
            cpu0 = time.process_time()
            lines = run_timed(
                engine,
                [
                    GenerateRequest(p, _greedy(max_tokens), constraint=handle, jump_forward=mode, strict=True)
                    for p in prompts
                ],
            )
            s = engine.stats()
            tokens = sum(tl.last.completion_tokens for tl in lines)
            cpu = time.process_time() - cpu0
            runs[mode].append(
                {
                    "tok_s": s.generated_tokens / s.engine_seconds,
                    "tok_cpu_s": s.generated_tokens / cpu,
                    "ppt": sum(len(tl.events) for tl in lines) / tokens,
                    "batch_ppt": s.forward_passes / s.generated_tokens,
                    "drafted": s.jump_forward_tokens + s.jump_forward_rejected,
                    "rejected": s.jump_forward_rejected,
                    "tokens": tokens,
                }
            )
            outputs[mode] = [[t for ev in tl.events for t in ev.token_ids] for tl in lines]
    med = lambda mode, key: statistics.median(r[key] for r in runs[mode])
    rec = {
        "metric": "jump_forward",
        "requests": len(prompts),
        "max_tokens": max_tokens,
        "speedup_verify": med("verify", "tok_s") / med("off", "tok_s"),
        "speedup_direct": med("direct", "tok_s") / med("off", "tok_s"),
        "speedup_verify_cpu": med("verify", "tok_cpu_s") / med("off", "tok_cpu_s"),
        "speedup_direct_cpu": med("direct", "tok_cpu_s") / med("off", "tok_cpu_s"),
    }
    for mode in runs:
        rec[f"passes_per_token_{mode}"] = med(mode, "ppt")
    for mode in runs:
        rec[f"batch_passes_per_token_{mode}"] = med(mode, "batch_ppt")
    for mode in runs:
        rec[f"tok_s_{mode}"] = med(mode, "tok_s")
    for mode in ("verify", "direct"):
        rec[f"drafted_{mode}"] = runs[mode][-1]["drafted"]
        rec[f"rejected_{mode}"] = runs[mode][-1]["rejected"]
    rec["output_tokens"] = runs["off"][-1]["tokens"]
    rec["verify_equals_off"] = outputs["verify"] == outputs["off"]
    # The first repetition drafts with nothing learned yet (grammar/engines/draft_split.py learns the
    # model's split of forced text as it writes); the medians above include the later ones.
    rec["speedup_verify_first_rep"] = runs["verify"][0]["tok_s"] / runs["off"][0]["tok_s"]
    rec["passes_per_token_verify_first_rep"] = runs["verify"][0]["ppt"]
    rec["rejected_verify_first_rep"] = runs["verify"][0]["rejected"]
    rec.update(_jump_forward_batch1(engine, handle, prompts[: 1 if quick else 2], max_tokens))
    return rec


def _jump_forward_batch1(engine: Engine, handle, prompts: list, max_tokens: int) -> dict:
    """The same extraction one request at a time (an agent waiting on each answer): a pass then
    costs about the same with a few draft tokens as with one, so fewer passes is nearly all gain."""
    tok_s: dict[str, list[float]] = {"off": [], "verify": []}
    for p in prompts:
        for mode in tok_s:
            engine.flush_cache()
            run_timed(
                engine, [GenerateRequest(p, _greedy(max_tokens), constraint=handle, jump_forward=mode, strict=True)]
            )
            s = engine.stats()
            tok_s[mode].append(s.generated_tokens / s.engine_seconds)
    return {
        "batch1_tok_s_off": statistics.median(tok_s["off"]),
        "batch1_tok_s_verify": statistics.median(tok_s["verify"]),
        "batch1_speedup_verify": statistics.median(v / o for v, o in zip(tok_s["verify"], tok_s["off"])),
    }


def compile_costs(engine: Engine, quick: bool) -> dict:
    """Cold compiles over the test corpus, then memory hits (same service) and disk hits (a new
    service on the same folder, as after a restart). Every lookup starts from the raw schema or
    pattern, as a request does: spec, canonical key, then the cache."""
    refused = json.loads((DATA / "schema_corpus_refusals.json").read_text())
    raw = [
        ("json_schema", json.loads(p.read_text()))
        for p in sorted((DATA / "schema_corpus").glob("*.json"))
        if p.stem not in refused
    ]
    raw += [("regex", r["pattern"]) for r in json.loads((DATA / "regex_corpus.json").read_text())]
    if quick:
        raw = raw[::6]
    spec = lambda kind, payload: getattr(GrammarSpec, kind)(payload)
    tok, vocab = engine.tokenizer, engine.model_config.vocab_size

    def timed(svc: GrammarService) -> list[float]:
        out = []
        for kind, payload in raw:
            t0 = time.perf_counter()
            svc.compile(spec(kind, payload))
            out.append(time.perf_counter() - t0)
        return out

    with tempfile.TemporaryDirectory() as cache_dir:
        svc = GrammarService(tok, vocab, cache_dir=cache_dir)
        cold = timed(svc)
        memory = timed(svc) + timed(svc)
        svc.close()
        fresh = GrammarService(tok, vocab, cache_dir=cache_dir)  # a restart: memory empty, disk warm
        disk = timed(fresh)
        stats = fresh.stats()
        fresh.close()
    ms = lambda xs, q=50: 1000 * (statistics.quantiles(xs, n=100)[q - 1] if len(xs) > 1 else xs[0])
    return {
        "metric": "compile",
        "specs": len(raw),
        "cold_ms_p50": ms(cold),
        "cold_ms_p90": ms(cold, 90),
        "memory_hit_ms": ms(memory),
        "memory_hit_ms_p90": ms(memory, 90),
        "disk_hit_ms": ms(disk),
        "disk_hit_ms_p90": ms(disk, 90),
        "disk_hit_frac_of_cold": statistics.median(disk) / statistics.median(cold),
        "disk_hits": stats.disk_hits,
        "misses_after_restart": stats.misses,
    }


def completeness(engine: Engine, svc: GrammarService, quick: bool) -> dict:
    """Loop-prone extraction without / with strict mode, then the strict step overhead on a
    workload where neither closing nor loop breaking fires."""
    import jsonschema

    schema = _schema("extract_12_fields")
    validator = jsonschema.Draft202012Validator(schema)
    handle = svc.compile(GrammarSpec.json_schema(schema))
    docs = PROFILES[:4] if quick else PROFILES
    asks = [
        "Extract the person and company record: ",
        "Fill in every field (skills, languages and past employers as lists) from this profile: ",
    ]
    prompts = [
        chat(engine.tokenizer, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": a + d}])
        for a in (asks[:1] if quick else asks)
        for d in docs
    ]
    specs = [
        GenerateRequest(p, _greedy(160), constraint=handle, strict=strict) for strict in (False, True) for p in prompts
    ]
    results = engine.generate_many(specs, timeout=3600)
    off, on = results[: len(prompts)], results[len(prompts) :]
    off_ok = [_complete(r.text, validator) for r in off]
    on_ok = [_complete(r.text, validator) for r in on]
    rec = {
        "metric": "completeness",
        "requests": len(prompts),
        "max_tokens": 160,
        "complete_frac_off": sum(c for c, _ in off_ok) / len(off),
        "valid_frac_off": sum(v for _, v in off_ok) / len(off),
        "complete_frac_on": sum(c for c, _ in on_ok) / len(on),
        "valid_frac_on": sum(v for _, v in on_ok) / len(on),
        "finish_length_on": sum(r.finish_reason == "length" for r in on) / len(on),
    }

    # strict overhead where nothing fires: small schemas answered well within a big budget
    reps = 2 if quick else 5
    items = [
        (
            svc.compile(GrammarSpec.json_schema(_schema(n))),
            chat(engine.tokenizer, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]),
        )
        for n, q in (WELL_BEHAVED[:2] if quick else WELL_BEHAVED)
    ]
    engine.generate_many([GenerateRequest(p, _greedy(1)) for _, p in items])  # prompts into the prefix cache

    def run(strict: bool):
        return _timed(
            engine,
            [GenerateRequest(p, _greedy(256), constraint=h, strict=strict, jump_forward="off") for h, p in items],
        )

    pairs, cpu_pairs, identical = [], [], True
    for i in range(reps):  # alternate which goes first
        if i % 2:
            res_on, d_on = run(True)
            res_off, d_off = run(False)
        else:
            res_off, d_off = run(False)
            res_on, d_on = run(True)
        identical &= [r.token_ids for r in res_on] == [r.token_ids for r in res_off]
        pairs.append(
            (d_on["engine_seconds"] / d_on["forward_passes"], d_off["engine_seconds"] / d_off["forward_passes"])
        )
        cpu_pairs.append((d_on["cpu_s"], d_off["cpu_s"]))
    rec["step_overhead"] = _median_ratio(pairs)
    rec["step_overhead_cpu"] = _median_ratio(cpu_pairs)
    rec["step_overhead_outputs_identical"] = identical
    rec["step_overhead_tokens"] = d_on["generated_tokens"]
    return rec


def run(quick: bool = False, argv=None) -> None:
    engine = Engine(kv_pool_tokens=16384).start()
    svc = GrammarService(engine.tokenizer, engine.model_config.vocab_size, cache_dir=None)
    try:
        emit(mask_overhead(engine, svc, quick))
        emit(jump_forward(engine, svc, quick))
        emit(compile_costs(engine, quick))
        emit(completeness(engine, svc, quick))
    finally:
        svc.close()
        engine.shutdown()
