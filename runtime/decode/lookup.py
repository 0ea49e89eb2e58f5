"""Prompt-lookup drafts: the next tokens guessed from an earlier occurrence of the last few.

Extraction copies spans of the document, tool arguments copy the user's words, multi-turn answers
repeat earlier turns. `NgramIndex` remembers, for each n-gram (n from `MAX_NGRAM` down to
`MIN_NGRAM`) of a request's tokens, where it last ended; the tokens that followed it there are the
draft. Drafts are verified like jump-forward's (decoding.py: exact under greedy, the rejection
rule under sampling), so they change how many passes an output takes, never the output.

`LookupDraft` decides how long a draft pays for its extra logits rows: it keeps a decayed estimate
of how often a drafted token is accepted, given the one before it was, and drafts the i-th token
only while the chance that it is accepted beats the cost of its row (`row_cost`: a share of what
a decode step spends per output token, measured by row_cost.py or fixed). A request whose drafts
stop paying drafts nothing, but tries one token every `PROBE_EVERY` steps, so a later stretch of
copying is still found.

`SharedOutputs` adds the outputs of the other requests whose prompts begin alike (the same first
`SHARED_PREFIX` tokens in the same cache namespace: one agent's system prompt and tools, one
document): an agent's tool calls and an extractor's records repeat their structure and many of
their values from request to request, though the prompt holds none of it. A request drafts from
whichever source matches the longer n-gram (its own on a tie), while the others still write.
Opt-in (`--speculative-shared`, runtime/engine/intake.py's `LookupSettings`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from runtime.decode.row_cost import RowCost

MAX_NGRAM = 4
MIN_NGRAM = 2
PROBE_EVERY = 16
# Prior of the acceptance estimate: one accepted of two tried (rate 0.5), worth this many tries.
PRIOR_ACCEPTED, PRIOR_TRIED = 1.0, 2.0
DECAY = 0.9  # weight of the past per verified draft: the estimate follows the current stretch
SHARED_PREFIX = 64  # prompt tokens that place a request in a group sharing outputs (with its namespace)
SHARED_MAX_NGRAM = 6  # longer contexts than a request's own: another output is a weaker guess than its own
SHARED_SOURCES = 16  # a group's latest outputs kept as sources
SHARED_KEYS = 32768  # n-grams a group holds (~200 bytes each) before it keeps fewer sources
SOURCE_TOKENS = SHARED_KEYS // (2 * (SHARED_MAX_NGRAM - 1))  # output tokens of one source indexed, at most
SHARED_GROUPS = 8  # groups kept, the least recently joined dropped first


def ngrams_before(tokens: Sequence[int], end: int, max_n: int) -> list[tuple[int, ...]]:
    """The n-grams of `MIN_NGRAM` to `max_n` tokens that end just before position `end`."""
    return [tuple(tokens[end - n : end]) for n in range(MIN_NGRAM, min(max_n, end) + 1)]


class NgramIndex:
    """Where each n-gram of a growing token list last ended (the position of the token after it).

    Built incrementally: `update(tokens)` indexes the tokens appended since the last call (a list
    that shrank, a rewind, is indexed again from scratch)."""

    __slots__ = ("ends", "indexed")

    def __init__(self) -> None:
        self.ends: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # tokens[:indexed] are in `ends`

    def forget_from(self, length: int) -> None:
        """The list was cut to `length` tokens (a rewind): index it again from scratch, since
        positions past the cut may soon hold other tokens."""
        if length < self.indexed:
            self.ends.clear()
            self.indexed = 0

    def update(self, tokens: Sequence[int]) -> None:
        self.forget_from(len(tokens))
        # the n-grams followed by a known token: those ending at positions 1 .. len - 1
        for end in range(max(self.indexed, 1), len(tokens)):
            for key in ngrams_before(tokens, end, MAX_NGRAM):
                self.ends[key] = end
        self.indexed = max(self.indexed, len(tokens))

    def continuation(self, tokens: Sequence[int], tail: Sequence[int], limit: int) -> list[int]:
        """Up to `limit` tokens that followed the last occurrence of the longest n-gram ending
        `tokens + tail` (`tail`: a draft already queued after `tokens`, not indexed)."""
        return self.match(tokens, tail, limit)[1]

    def match(self, tokens: Sequence[int], tail: Sequence[int], limit: int) -> tuple[int, list[int]]:
        """`continuation`, with the length of the n-gram it matched (0: none)."""
        if limit <= 0:
            return 0, []
        context = list(tokens[-MAX_NGRAM:]) + list(tail)
        for n in range(min(MAX_NGRAM, len(context)), MIN_NGRAM - 1, -1):
            end = self.ends.get(tuple(context[-n:]))
            if end is not None:
                return n, list(tokens[end : end + limit])
        return 0, []


class SharedOutputs:
    """The outputs of one group of requests (prompts that begin alike, one namespace), as n-grams
    of up to `SHARED_MAX_NGRAM` tokens, each pointing into its source's live token list. Only the
    engine thread touches a group; `SharedDrafts.group` (any thread) only hands it out."""

    __slots__ = ("sources", "ends", "next_id")

    def __init__(self) -> None:
        # source id -> [its token list (prompt then output, growing), first output position, indexed to]
        self.sources: OrderedDict[int, list] = OrderedDict()
        self.ends: dict[tuple[int, ...], tuple[int, int]] = {}  # n-gram -> (source id, position after it)
        self.next_id = 0

    def join(self, tokens: list[int], start: int) -> int:
        """A new source whose output begins at `start` of `tokens`; the oldest beyond
        `SHARED_SOURCES` is dropped (its n-grams then lead nowhere, and go at the next re-index)."""
        sid, self.next_id = self.next_id, self.next_id + 1
        self.sources[sid] = [tokens, start, start]
        while len(self.sources) > SHARED_SOURCES:
            self.sources.popitem(last=False)
        return sid

    def publish(self, sid: int, tokens: list[int]) -> None:
        """Index the output tokens `sid` wrote since its last call: each with the n-grams before it."""
        entry = self.sources.get(sid)
        if entry is None:
            return
        entry[0] = tokens  # the same list, or a new one after a rewind rebuilt it
        self._index(sid, entry)
        if len(self.ends) > SHARED_KEYS:
            self._reindex(sid)

    def forget_from(self, sid: int, length: int) -> None:
        """`sid`'s token list was cut to `length` tokens (a rewind): its n-grams ending past the cut
        go, and the tokens written there are indexed again as they come."""
        entry = self.sources.get(sid)
        if entry is None or entry[2] <= length:
            return
        entry[2] = max(entry[1], length)
        stale = [key for key, (owner, end) in self.ends.items() if owner == sid and end >= length]
        for key in stale:
            del self.ends[key]

    def _index(self, sid: int, entry: list) -> None:
        tokens, start, done = entry
        upto = min(len(tokens), start + SOURCE_TOKENS)
        for end in range(max(done, start, 1), upto):
            for key in ngrams_before(tokens, end, SHARED_MAX_NGRAM):
                self.ends[key] = (sid, end)
        entry[2] = max(done, upto)

    def _reindex(self, keep: int) -> None:
        """Index anew only the newest sources (and `keep`) within half the bound, so this stays rare:
        the n-grams of dropped sources go, and the oldest kept ones with them."""
        budget = SHARED_KEYS // 2
        for sid in reversed(list(self.sources)):
            entry = self.sources[sid]
            size = (entry[2] - entry[1]) * (SHARED_MAX_NGRAM - 1)
            if size > budget and sid != keep:
                del self.sources[sid]
            else:
                budget -= size
        self.ends.clear()
        for sid, entry in self.sources.items():  # oldest first: a later occurrence wins, as before
            entry[2] = entry[1]
            self._index(sid, entry)

    def match(self, context: Sequence[int], longer_than: int, limit: int, own: int) -> tuple[int, list[int]]:
        """The tokens after another source's latest occurrence of the longest n-gram ending
        `context`, if longer than `longer_than` tokens."""
        for n in range(min(SHARED_MAX_NGRAM, len(context)), max(longer_than, MIN_NGRAM - 1), -1):
            hit = self.ends.get(tuple(context[-n:]))
            if hit is None or hit[0] == own:
                continue
            entry = self.sources.get(hit[0])
            if entry is not None and hit[1] < len(entry[0]):
                return n, list(entry[0][hit[1] : hit[1] + limit])
        return 0, []


class SharedDrafts:
    """The engine's groups of shared outputs, keyed by namespace and the prompt's first
    `SHARED_PREFIX` tokens; the least recently joined dropped beyond `SHARED_GROUPS`."""

    def __init__(self) -> None:
        self.groups: OrderedDict[tuple, SharedOutputs] = OrderedDict()
        self.lock = threading.Lock()  # requests arrive on the server's threads

    def group(self, namespace: str, prompt_ids: Sequence[int]) -> SharedOutputs:
        key = (namespace, tuple(prompt_ids[:SHARED_PREFIX]))
        with self.lock:
            found = self.groups.get(key)
            if found is None:
                found = self.groups[key] = SharedOutputs()
                while len(self.groups) > SHARED_GROUPS:
                    self.groups.popitem(last=False)
            self.groups.move_to_end(key)
            return found


class LookupDraft:
    """One request's prompt-lookup state: its n-gram index and how well its drafts do."""

    __slots__ = ("index", "accepted", "tried", "max_tokens", "cost", "idle_steps", "last_len", "shared", "start", "sid")

    def __init__(
        self, max_tokens: int, row_cost: float | RowCost, shared: SharedOutputs | None = None, start: int = 0
    ) -> None:
        """`shared`: the group whose outputs this request drafts from and writes to; `start`: the
        position of its first output token (its prompt's length)."""
        self.index = NgramIndex()
        self.shared = shared
        self.start = start
        self.sid: int | None = None  # joins `shared` at its first draft (on the engine thread)
        self.accepted = PRIOR_ACCEPTED
        self.tried = PRIOR_TRIED
        self.max_tokens = max_tokens
        # shared by the engine's requests, which it updates after each step (a float: fixed)
        self.cost = row_cost if isinstance(row_cost, RowCost) else RowCost.fixed(row_cost)
        self.idle_steps = 0  # steps since the last draft while drafts do not pay
        self.last_len = 0  # tokens of the draft now awaiting verification (0: none)

    @property
    def row_cost(self) -> float:
        return self.cost.share

    @property
    def rate(self) -> float:
        """Estimated chance that a drafted token is accepted, given the one before it was."""
        return self.accepted / self.tried

    def worth(self) -> int:
        """How many tokens a draft should have now: the i-th while rate**i > row_cost."""
        k, p, cost = 0, self.rate, self.cost.share
        while k < self.max_tokens and p > cost:
            k += 1
            p *= self.rate
        if k == 0:
            self.idle_steps += 1
            if self.idle_steps >= PROBE_EVERY:
                self.idle_steps = 0
                return 1
        return k

    def forget_from(self, length: int) -> None:
        """The request's tokens were cut to `length` (a rewind): its own index and its shared
        source both forget what followed."""
        self.index.forget_from(length)
        if self.shared is not None and self.sid is not None:
            self.shared.forget_from(self.sid, length)

    def propose(self, tokens: Sequence[int], tail: Sequence[int], room: int) -> list[int]:
        """The draft to queue after `tokens + tail` (at most `room` tokens; may be empty)."""
        if self.shared is not None:
            if self.sid is None:
                self.sid = self.shared.join(tokens, self.start)
            self.shared.publish(self.sid, tokens)
        limit = min(room, self.worth())
        if limit <= 0:
            return []
        self.index.update(tokens)
        n, draft = self.index.match(tokens, tail, limit)
        if self.shared is not None:
            context = list(tokens[-SHARED_MAX_NGRAM:]) + list(tail)
            n_shared, other = self.shared.match(context, n, limit, self.sid)
            if n_shared > n:
                return other
        return draft

    def verified(self, drafted: int, accepted: int) -> None:
        """Learn from a verified draft: `accepted` of its `drafted` tokens, in order, were kept."""
        if drafted <= 0:
            return
        # each accepted token is a success; the first rejected one (if any) is the one failure
        self.accepted = DECAY * self.accepted + accepted
        self.tried = DECAY * self.tried + accepted + (1 if accepted < drafted else 0)
