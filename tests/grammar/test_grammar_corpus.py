"""Every corpus schema compiles (and accepts its example instances token by token), or is
refused with the recorded pointer and message."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from grammar import GrammarSpec, GrammarSpecError

DATA = Path(__file__).parents[1] / "data"
CORPUS = sorted((DATA / "schema_corpus").glob("*.json"))
EXAMPLES = json.loads((DATA / "schema_corpus_examples.json").read_text())
REFUSED = {
    k: v for k, v in json.loads((DATA / "schema_corpus_refusals.json").read_text()).items() if not k.startswith("_")
}


def test_corpus_is_large_and_covers_the_loop_prone_cases():
    names = {p.stem for p in CORPUS}
    assert len(names) - len(REFUSED) >= 60
    assert "extract_12_fields" in names
    assert sum(n.startswith("loop_prone_") for n in names) >= 4
    assert set(REFUSED) <= names
    extract = json.loads((DATA / "schema_corpus" / "extract_12_fields.json").read_text())
    assert len(extract["properties"]) == 12 and extract["required"] == list(extract["properties"])


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_corpus_schema_compiles_or_is_refused_clearly(path, service, tokenizer):
    schema = json.loads(path.read_text())
    spec = GrammarSpec.json_schema(schema)
    if path.stem in REFUSED:
        with pytest.raises(GrammarSpecError) as e:
            service.compile(spec)
        assert e.value.pointer == REFUSED[path.stem]["pointer"]
        assert REFUSED[path.stem]["message"] in e.value.message
        assert e.value.param == "response_format"
        return
    handle = service.compile(spec)
    for instance in EXAMPLES.get(path.stem, []):
        jsonschema.validate(instance, schema)  # the example itself is right
        text = json.dumps(instance, separators=(",", ":"), ensure_ascii=False)
        matcher = handle.new_matcher()
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert all(matcher.accept(t) for t in ids), text
        assert matcher.is_completed(), text
        assert matcher.accept(tokenizer.eos_token_id) and matcher.is_terminated()


def test_compact_output_only(service, tokenizer):
    handle = service.compile(
        GrammarSpec.json_schema(json.loads((DATA / "schema_corpus" / "person_basic.json").read_text()))
    )
    for text in ('{"name": "Ada","age":3}', '{ "name":"Ada","age":3}', '{"name":"Ada",\n"age":3}'):
        matcher = handle.new_matcher()
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert not all(matcher.accept(t) for t in ids), text
