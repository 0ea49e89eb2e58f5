"""The OpenAI Agents SDK against Jumpgate's Responses API (`/v1/responses`).

Part 1: an agent with a function tool and a structured final output (a pydantic model). The SDK
sends the tool and the output type's JSON schema together; Jumpgate constrains every turn to a
valid tool call (which the SDK runs) or a final answer that parses into the model. The default
model is tiny: it may answer without the tool, and after a tool result it tends to repeat the call,
so the run is bounded by --max-turns.

Part 2: a conversation chained with `previous_response_id` (`Runner.run(...,
previous_response_id=...)`, so only the new message is sent); the server keeps each turn and
renders the next one as an exact extension of it, so the printed `cached_tokens` cover nearly the
whole prompt from the second turn on.

    make run                                   # in another terminal
    python examples/agents_sdk.py

Environment: JUMPGATE_BASE_URL (default http://127.0.0.1:8000/v1), JUMPGATE_API_KEY,
JUMPGATE_MODEL (default: the first model the server lists).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI
from pydantic import BaseModel, Field

TURNS = [
    "My name is Ada and I live in Lisbon.",
    "What is a good museum there?",
    "And where should I eat near it?",
    "Remind me: what is my name?",
]


class WeatherReport(BaseModel):
    city: str = Field(max_length=40)
    summary: str = Field(max_length=80)


class Reply(BaseModel):
    answer: str = Field(max_length=120)


@function_tool
def get_weather(city: str) -> str:
    """Get the current weather for a city."""
    return f"Sunny, 21 C in {city}."  # a stand-in for a real weather service


async def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--turns", type=int, default=len(TURNS), help="chained turns in part 2")
    ap.add_argument("--max-turns", type=int, default=4, help="model calls allowed in part 1")
    args = ap.parse_args(argv)

    set_tracing_disabled(True)  # traces would go to OpenAI's servers
    client = AsyncOpenAI(
        base_url=os.environ.get("JUMPGATE_BASE_URL", "http://127.0.0.1:8000/v1"),
        api_key=os.environ.get("JUMPGATE_API_KEY", "not-needed"),
    )
    model_id = os.environ.get("JUMPGATE_MODEL") or (await client.models.list()).data[0].id
    model = OpenAIResponsesModel(model=model_id, openai_client=client)
    settings = ModelSettings(temperature=0, max_tokens=args.max_tokens)

    # -- 1. a tool and a structured final output
    reporter = Agent(
        name="weather",
        instructions="You report the weather.",
        tools=[get_weather],
        output_type=WeatherReport,
        model=model,
        model_settings=settings,
    )
    result = await Runner.run(reporter, "Tell me about the weather in Lisbon today.", max_turns=args.max_turns)
    report: WeatherReport = result.final_output
    calls = [item for item in result.new_items if item.type == "tool_call_item"]
    print(f"structured output after {len(calls)} tool call(s): {report!r}")

    # -- 2. a chain of turns; each one continues the stored previous response
    # The SDK treats a reply cut at max_tokens (status "incomplete") as an error, and the tiny model
    # rambles; a short structured reply is bounded by its schema instead.
    chat = Agent(
        name="guide", instructions="You are a travel guide.", output_type=Reply, model=model, model_settings=settings
    )
    previous = None
    for turn, text in enumerate(TURNS[: args.turns], 1):
        result = await Runner.run(chat, text, previous_response_id=previous)
        response = result.raw_responses[-1]
        usage = response.usage
        previous = result.last_response_id
        print(
            f"turn {turn}: input_tokens={usage.input_tokens} cached_tokens={usage.input_tokens_details.cached_tokens}"
            f" -> {result.final_output.answer!r}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
