"""Agent frameworks as they are used, against one real `jumpgate serve` (SmolLM2-135M on CPU).

Each test checks that the framework got what it asked for: a parsed object of its output type, or a
tool call it executed. The model is tiny; the grammar makes its answers parse, prompts and schemas
are kept small (content quality is not the point). instructor is installed by `make setup` outside
the extras (its jiter pin; see the Makefile).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from enum import Enum
from pathlib import Path
from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field

from bench.harness.server_process import MODEL

pytestmark = pytest.mark.e2e

MAX_TOKENS = 80
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class City(BaseModel):
    city: str = Field(max_length=30)
    country: str = Field(max_length=30)


class WeatherTool:
    """A get_weather function that records its calls (the proof that the framework executed it)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, city: str) -> str:
        """Get the current weather for a city."""
        self.calls.append(city)
        return f"Sunny, 21 C in {city}."


def weather_function():
    tool = WeatherTool()

    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        return tool(city)

    return tool, get_weather


@pytest.fixture(scope="module")
def server(jumpgate_server):
    return jumpgate_server  # the session's one server (tests/conftest.py)


# --------------------------------------------------------------------------- OpenAI Agents SDK


@pytest.fixture(scope="module")
def agents_model(server):
    """`agents_model(api)`: an Agents SDK model over the Responses or the Chat Completions API. Call
    it inside the test's event loop (an async client belongs to the loop it was made in)."""
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)

    def make(api: str):
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=180)
        if api == "responses":
            return agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
        return agents.OpenAIChatCompletionsModel(model=MODEL, openai_client=client)

    return make


def run_agent(agent_factory, question: str, max_turns: int):
    """Build the agent and run it in one event loop, bounded in time."""
    from agents import Runner

    async def main():
        return await asyncio.wait_for(Runner.run(agent_factory(), question, max_turns=max_turns), 300)

    return asyncio.run(main())


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_agents_sdk_runs_a_function_tool(agents_model, api):
    from agents import Agent, ModelSettings, function_tool

    tool, get_weather = weather_function()
    result = run_agent(
        lambda: Agent(
            name="weather",
            instructions="Answer weather questions with the tool.",
            tools=[function_tool(get_weather)],
            tool_use_behavior="stop_on_first_tool",
            model=agents_model(api),
            model_settings=ModelSettings(
                tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=MAX_TOKENS
            ),
        ),
        "What's the weather in Paris?",
        max_turns=2,
    )
    assert len(tool.calls) == 1 and tool.calls[0]
    assert result.final_output == f"Sunny, 21 C in {tool.calls[0]}."


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_agents_sdk_structured_output(agents_model, api):
    from agents import Agent, ModelSettings

    result = run_agent(
        lambda: Agent(
            name="geo",
            instructions="Name a big city and its country.",
            output_type=City,
            model=agents_model(api),
            model_settings=ModelSettings(temperature=0, max_tokens=MAX_TOKENS),
        ),
        "A big city, please.",
        max_turns=2,
    )
    assert isinstance(result.final_output, City)


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_agents_sdk_tool_and_output_type(agents_model, api):
    """Tools and an output type together (the Agents SDK sends both): the run ends with a parsed
    output, after any tool calls the model chose to make (each one executed by the SDK)."""
    from agents import Agent, ModelSettings, function_tool

    tool, get_weather = weather_function()
    result = run_agent(
        lambda: Agent(
            name="weather",
            instructions="You report the weather.",
            output_type=City,
            tools=[function_tool(get_weather)],
            model=agents_model(api),
            model_settings=ModelSettings(temperature=0, max_tokens=MAX_TOKENS),
        ),
        "Which city is the capital of France?",
        max_turns=4,
    )
    assert isinstance(result.final_output, City)
    assert all(isinstance(city, str) for city in tool.calls)


# --------------------------------------------------------------------------- pydantic-ai


@pytest.fixture(scope="module")
def pydantic_ai_model(server):
    pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=server.base_url, api_key="x"))


def test_pydantic_ai_structured_output(pydantic_ai_model):
    from pydantic_ai import Agent
    from pydantic_ai.settings import ModelSettings

    agent = Agent(
        pydantic_ai_model, output_type=City, model_settings=ModelSettings(temperature=0, max_tokens=MAX_TOKENS)
    )
    assert isinstance(agent.run_sync("Name a big city and its country.").output, City)


def test_pydantic_ai_runs_a_tool(pydantic_ai_model):
    """An output function: pydantic-ai offers it as a tool, the model calls it, pydantic-ai runs it."""
    from pydantic_ai import Agent
    from pydantic_ai.settings import ModelSettings

    tool, get_weather = weather_function()
    agent = Agent(
        pydantic_ai_model, output_type=get_weather, model_settings=ModelSettings(temperature=0, max_tokens=MAX_TOKENS)
    )
    result = agent.run_sync("What is the weather in Paris?")
    assert len(tool.calls) == 1 and result.output == f"Sunny, 21 C in {tool.calls[0]}."


# --------------------------------------------------------------------------- LangChain / LangGraph


@pytest.fixture(scope="module")
def chat_openai(server):
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        base_url=server.base_url,
        api_key="x",
        model=MODEL,
        temperature=0,
        max_tokens=MAX_TOKENS,
        max_retries=0,
        timeout=180,
    )


def test_langchain_structured_output(chat_openai):
    structured = chat_openai.with_structured_output(City, method="json_schema")
    assert isinstance(structured.invoke("Name a big city and its country."), City)


def test_langchain_bind_tools_with_tool_choice(chat_openai):
    from langchain_core.tools import tool as as_tool

    tool, get_weather = weather_function()
    weather = as_tool(get_weather)
    message = chat_openai.bind_tools([weather], tool_choice="get_weather").invoke("What is the weather in Paris?")
    [call] = message.tool_calls
    assert call["name"] == "get_weather"
    assert weather.invoke(call["args"]) == f"Sunny, 21 C in {tool.calls[0]}."


def test_langgraph_react_agent_one_turn(chat_openai):
    """A prebuilt ReAct agent for one turn: the model calls the tool (forced), LangGraph runs it, and
    the tool's result ends the run (return_direct)."""
    pytest.importorskip("langgraph")
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool as as_tool
    from langgraph.prebuilt import create_react_agent

    tool, get_weather = weather_function()
    weather = as_tool(get_weather, return_direct=True)
    agent = create_react_agent(chat_openai.bind_tools([weather], tool_choice="required"), [weather])
    out = agent.invoke({"messages": [("user", "What is the weather in Paris?")]}, {"recursion_limit": 4})
    calls = [m for m in out["messages"] if isinstance(m, AIMessage) and m.tool_calls]
    results = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert len(calls) == 1 and tool.calls and len(results) == len(tool.calls)
    assert results[0].content == f"Sunny, 21 C in {tool.calls[0]}."


# --------------------------------------------------------------------------- instructor


class Category(str, Enum):  # noqa: UP042 - as instructor's docs write it
    billing = "billing"
    bug = "bug"
    other = "other"


class Ticket(BaseModel):
    """A support ticket: an int with bounds and an enum, so the parsed types are checkable."""

    priority: int = Field(ge=1, le=5)
    category: Category
    summary: str = Field(max_length=40)


class StreamedTicket(BaseModel):
    """Ticket with a Literal for the category: instructor's stream parser validates jiter's dict in
    strict mode, where pydantic takes no str for an Enum field (an instructor limitation)."""

    priority: int = Field(ge=1, le=5)
    category: Literal["billing", "bug", "other"]
    summary: str = Field(max_length=40)


@pytest.fixture
def instructor_client(server):
    """`(make, sent)`: `make(mode)` is the official openai client patched by instructor; `sent` gets
    each request body, to check that the mode used the API feature it is meant to."""
    instructor = pytest.importorskip("instructor")
    import httpx

    sent: list[dict] = []
    http = httpx.Client(timeout=180, event_hooks={"request": [lambda r: sent.append(json.loads(r.content))]})
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, http_client=http)
    yield (lambda mode: instructor.from_openai(client, mode=getattr(instructor.Mode, mode))), sent
    http.close()


@pytest.mark.parametrize("mode", ["JSON_SCHEMA", "TOOLS"])
def test_instructor_response_model(instructor_client, mode):
    """JSON_SCHEMA sends response_format json_schema; TOOLS sends the model as the one forced tool.
    One attempt only (max_retries=0): a reply that does not validate fails the test, not a retry."""
    make, sent = instructor_client
    ticket = make(mode).chat.completions.create(
        model=MODEL,
        response_model=Ticket,
        max_retries=0,
        temperature=0,
        max_tokens=MAX_TOKENS,
        messages=[{"role": "user", "content": "File a ticket: I was charged twice this month."}],
    )
    assert isinstance(ticket, Ticket)  # instructor returns its own subclass of the model
    assert type(ticket.priority) is int and 1 <= ticket.priority <= 5
    assert isinstance(ticket.category, Category)
    assert isinstance(ticket.summary, str) and len(ticket.summary) <= 40
    [body] = sent
    if mode == "JSON_SCHEMA":
        assert body["response_format"]["type"] == "json_schema" and "tools" not in body
    else:
        [tool] = body["tools"]
        assert body["tool_choice"] == {"type": "function", "function": {"name": tool["function"]["name"]}}


@pytest.mark.parametrize("mode", ["JSON_SCHEMA", "TOOLS"])
def test_instructor_streams_partial_objects(instructor_client, mode):
    """create_partial over a stream: instructor parses each prefix with jiter's partial mode (the
    code its jiter<0.15 pin is about), so the objects fill in as tokens arrive."""
    make, sent = instructor_client
    partials = list(
        make(mode).chat.completions.create_partial(
            model=MODEL,
            response_model=StreamedTicket,
            max_retries=0,
            temperature=0,
            max_tokens=MAX_TOKENS,
            messages=[{"role": "user", "content": "File a ticket: the app crashes on start."}],
        )
    )
    [body] = sent  # one attempt, streamed
    assert body["stream"] is True and len(partials) > 1
    assert any(p.summary is None for p in partials[:-1])  # earlier objects were still incomplete
    last = partials[-1]
    assert type(last.priority) is int and last.category in ("billing", "bug", "other")
    assert isinstance(last.summary, str)
    assert StreamedTicket.model_validate(last.model_dump())  # the final object is complete and valid


# --------------------------------------------------------------------------- the example


def test_agents_sdk_example_runs(server):
    """examples/agents_sdk.py: a structured output, then a chain in which every turn after the first
    is served mostly from the cache (it extends the previous turn's exact tokens)."""
    pytest.importorskip("agents")
    env = {**os.environ, "JUMPGATE_BASE_URL": server.base_url, "JUMPGATE_API_KEY": "x"}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "agents_sdk.py"), "--turns", "3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=EXAMPLES.parent,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "structured output after" in proc.stdout
    turns = [(int(a), int(b)) for a, b in re.findall(r"input_tokens=(\d+) cached_tokens=(\d+)", proc.stdout)]
    assert len(turns) == 3, proc.stdout
    assert all(cached >= 0.8 * total for total, cached in turns[1:]), proc.stdout
