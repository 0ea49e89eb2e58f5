"""The request class whose JSON body decode does not trigger the cyclic garbage collector.

Decoding a large body creates one tracked container per JSON array/object: a 3.9 MB payload of
tiny containers is 1.3M of them, and each 700 allocations count towards a collection, so the
decode ran five or more full (generation 2) collections of the whole heap, each ~0.2 s with the
model loaded. That held the event loop for over a second (`/health` went unanswered). Nothing
cyclic is built by a JSON decode, so pausing the collector for its duration loses nothing.
"""

from __future__ import annotations

import gc
from typing import Any

from litestar import Request

LARGE_BODY_BYTES = 64 * 1024  # below this a decode allocates too little to trigger a full collection


class JumpgateRequest(Request):
    async def json(self) -> Any:
        body = await self.body()
        if len(body) < LARGE_BODY_BYTES or not gc.isenabled():
            return await super().json()
        gc.disable()
        try:
            return await super().json()  # the body is read already: this decodes without yielding
        finally:
            gc.enable()
