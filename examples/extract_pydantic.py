"""Structured extraction into a pydantic model with `client.chat.completions.parse`.

The openai client turns the pydantic model into a strict JSON schema (`response_format`), Jumpgate
compiles it into a grammar and the model can only write JSON of that shape, so `.parsed` is a
validated `Contact` instance.

    make run                                   # in another terminal
    python examples/extract_pydantic.py

Environment: JUMPGATE_BASE_URL (default http://127.0.0.1:8000/v1), JUMPGATE_API_KEY,
JUMPGATE_MODEL (default: the first model the server lists).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Literal

from openai import LengthFinishReasonError, OpenAI
from pydantic import BaseModel, Field

TEXTS = [
    "Hi, I'm Maria Lopez, senior data engineer at Northwind Logistics in Madrid. "
    "Reach me at maria.lopez@northwind.example or +34 600 123 456.",
    "Call Ken Sato (ken@sato-design.example), owner of Sato Design in Osaka, about the new logo.",
    "Dr. Amina Okafor leads the research lab at Lagos Health. Email: a.okafor@lagoshealth.example.",
]


class Contact(BaseModel):
    name: str = Field(description="Full name of the person")
    company: str
    city: str
    email: str
    role: Literal["engineer", "designer", "researcher", "manager", "other"]


def extract(client: OpenAI, model: str, text: str, max_tokens: int) -> Contact:
    messages = [
        {"role": "system", "content": "Extract the contact details from the user's text."},
        {"role": "user", "content": text},
    ]
    try:
        completion = client.chat.completions.parse(
            model=model,
            messages=messages,
            response_format=Contact,
            temperature=0,
            max_tokens=max_tokens,
        )
    except LengthFinishReasonError as exc:
        # Jumpgate closes strict JSON before the budget runs out, so even a cut answer is valid
        # JSON of the schema; the client only refuses it because finish_reason is "length".
        content = exc.completion.choices[0].message.content or ""
        print("  (finish_reason=length: the server closed the JSON at the token budget)")
        return Contact.model_validate_json(content)
    message = completion.choices[0].message
    if message.parsed is None:
        raise RuntimeError(f"no parsed output (refusal={message.refusal!r})")
    return message.parsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--count",
        type=int,
        default=int(os.environ.get("JUMPGATE_EXAMPLE_COUNT", len(TEXTS))),
        help="how many of the sample texts to extract from",
    )
    ap.add_argument("--max-tokens", type=int, default=160)
    args = ap.parse_args(argv)
    client = OpenAI(
        base_url=os.environ.get("JUMPGATE_BASE_URL", "http://127.0.0.1:8000/v1"),
        api_key=os.environ.get("JUMPGATE_API_KEY", "not-needed"),
    )
    model = os.environ.get("JUMPGATE_MODEL") or client.models.list().data[0].id
    for text in TEXTS[: max(1, args.count)]:
        print(f"text: {text}")
        contact = extract(client, model, text, args.max_tokens)
        print(f"  -> {contact.model_dump_json()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
