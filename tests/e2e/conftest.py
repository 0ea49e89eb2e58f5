"""Fixtures the end-to-end modules share: the session's one real server (tests/conftest.py), an
official `openai` client and a raw httpx client on it. A module may still define its own."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.conftest import openai_client

# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def server(jumpgate_server):
    return jumpgate_server  # the session's one server (tests/conftest.py)


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai_client(server)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=180) as c:
        yield c
