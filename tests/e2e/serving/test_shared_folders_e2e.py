"""Two models, one after the other, on the same folders (grammar cache, schema registry, stored
responses): two real `jumpgate serve` processes. The second model must leave every file of the
first as it was, and the first model's next start must use them."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from bench.harness.server_process import JumpgateServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # a second model built and served: the second tier

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
STRICT = {"type": "json_schema", "json_schema": {"name": "city", "strict": True, "schema": SCHEMA}}


def model_id(server: JumpgateServer) -> str:
    return httpx.get(server.base_url + "/models", timeout=10).json()["data"][0]["id"]


def strict_chat(server: JumpgateServer) -> dict:
    body = {
        "model": model_id(server),
        "messages": [{"role": "user", "content": "Name a city."}],
        "response_format": STRICT,
        "max_tokens": 24,
        "temperature": 0,
    }
    r = httpx.post(server.base_url + "/chat/completions", json=body, timeout=180)
    assert r.status_code == 200, r.text
    return r.json()


def files_under(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and not p.name.startswith("server-")}


def test_a_second_model_keeps_and_the_first_reuses_every_file(tmp_path, other_model_dir):
    first = JumpgateServer(tmp_path)
    with first:
        strict_chat(first)
        uploaded = httpx.post(first.base_url + "/schemas", json={"name": "city", "schema": SCHEMA}, timeout=30)
        assert uploaded.status_code in (200, 201), uploaded.text
        stored = httpx.post(
            first.base_url + "/responses",
            json={"model": model_id(first), "input": "Hi.", "max_output_tokens": 4, "store": True},
            timeout=180,
        )
        assert stored.status_code == 200, stored.text
    written = files_under(tmp_path)
    assert any(p.suffix == ".json" and "grammars" in p.parts for p in written), written.keys()
    assert any("registry" in p.parts for p in written) and any("responses" in p.parts for p in written)

    second = JumpgateServer(tmp_path, extra_args=["--model", str(other_model_dir)])
    with second:
        strict_chat(second)  # its own grammar, for its own tokenizer, in the same folder
        assert httpx.get(f"{second.base_url}/schemas/{uploaded.json()['id']}", timeout=30).status_code == 200
    after = files_under(tmp_path)
    missing_or_changed = [str(p.relative_to(tmp_path)) for p, data in written.items() if after.get(p) != data]
    assert missing_or_changed == []
    assert len(after) > len(written)  # the second model's grammar sits beside the first's

    with JumpgateServer(tmp_path) as again:
        loaded = again.metrics().get("jumpgate_grammar_cache_disk_loaded_total", 0)
        assert loaded >= 1, again.log_tail()
        strict_chat(again)
        m = again.metrics()
        assert m["jumpgate_grammar_cache_misses_total"] == 0  # the strict request's grammar came from disk
        assert m["jumpgate_grammar_cache_hits_total"] >= 1
        rid = stored.json()["id"]
        assert httpx.get(f"{again.base_url}/responses/{rid}", timeout=30).status_code == 200
