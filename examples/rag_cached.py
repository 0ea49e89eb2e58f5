"""Several questions over one document, with the document as a long system prompt.

Jumpgate renders the system prompt first and keeps its KV cache in a radix tree, so after the
first question the document's tokens are served from the cache: `usage.prompt_tokens_details.
cached_tokens` shows how many prompt tokens each question did not have to recompute.

    make run                                   # in another terminal
    python examples/rag_cached.py

Environment: JUMPGATE_BASE_URL (default http://127.0.0.1:8000/v1), JUMPGATE_API_KEY,
JUMPGATE_MODEL (default: the first model the server lists).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from openai import OpenAI

DOCUMENT = """\
Harbor Line Ferry Service: passenger handbook (edition 7)

Routes. Harbor Line runs three routes. The Blue route connects Pier 1 (Old Town) with North
Island every 20 minutes from 06:00 to 23:00; the crossing takes 18 minutes. The Green route links
Pier 4 (Market Square) with the Airport Terminal every 30 minutes from 05:30 to 00:30; it takes
35 minutes and stops at Lighthouse Point on request. The Red route is a summer-only loop (June to
September) from Pier 1 around the Seven Rocks, leaving at 10:00, 13:00 and 16:00; it lasts 90
minutes and includes a guided commentary in English and Spanish.

Tickets. A single ticket costs 3.80 euros on the Blue and Green routes and 14 euros on the Red
route. A day pass costs 9.50 euros and covers the Blue and Green routes without limit. Children
under six travel free; children from six to fourteen and seniors over 65 pay half price.
Bicycles cost 2 euros per crossing and are not allowed on the Red route. Tickets are sold at the
pier machines, in the Harbor Line app, and on board with a surcharge of 1 euro.

Luggage and pets. Each passenger may bring two pieces of luggage. Dogs on a leash travel free;
other pets must be in a closed carrier. Surfboards and kayaks are carried on the Green route only,
for 5 euros, and must be booked one day in advance.

Accessibility. All Blue and Green route vessels have step-free access and an accessible toilet.
The Red route vessel, the historic Marisol built in 1958, has two steps at the gangway; crew will
help passengers who ask.

Weather. Services are suspended when wind speed exceeds 45 knots. Suspensions are announced in
the app and on the displays at every pier at least 30 minutes before the planned departure when
possible. A ticket bought for a suspended crossing is refunded automatically to the same card.

Lost property. Items found on board are kept at the Pier 1 office for 60 days. The office is open
Monday to Saturday, 08:00 to 18:00. Call +30 210 555 0199 or write to found@harborline.example.
"""

QUESTIONS = [
    "How long does the Blue route crossing take?",
    "How much is a day pass, and which routes does it cover?",
    "Can I take my bicycle on the Red route?",
    "Where do I collect an umbrella I left on board?",
    "What happens to my ticket if the crossing is cancelled because of wind?",
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=int(os.environ.get("JUMPGATE_EXAMPLE_COUNT", len(QUESTIONS))))
    ap.add_argument("--max-tokens", type=int, default=80)
    args = ap.parse_args(argv)
    client = OpenAI(
        base_url=os.environ.get("JUMPGATE_BASE_URL", "http://127.0.0.1:8000/v1"),
        api_key=os.environ.get("JUMPGATE_API_KEY", "not-needed"),
    )
    model = os.environ.get("JUMPGATE_MODEL") or client.models.list().data[0].id
    system = "Answer the passenger's question using only the handbook below. Be brief.\n\n" + DOCUMENT
    for question in QUESTIONS[: max(1, args.questions)]:
        t0 = time.perf_counter()
        resp = client.chat.completions.create(
            model=model,
            temperature=0,
            max_tokens=args.max_tokens,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        )
        elapsed = time.perf_counter() - t0
        usage = resp.usage
        assert usage is not None
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
        print(f"Q: {question}")
        print(f"A: {(resp.choices[0].message.content or '').strip()}")
        print(
            f"   prompt_tokens={usage.prompt_tokens} cached_tokens={cached} "
            f"({100.0 * (cached or 0) / max(1, usage.prompt_tokens):.0f}% from cache) in {elapsed:.2f} s\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
