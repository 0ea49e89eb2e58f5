"""Decoding: from logits rows to accepted tokens (greedy or sampled choice, grammar masks, strict
vetting, draft verification, jump-forward planning, finish conditions).

Written against the one matcher protocol in runtime/constraint.py. Ownership: runs on the engine
thread; it changes only the request's own state (its tokens, matcher, guard, `kv_len` and draft)
and the counters. KV slots of rejected draft tokens are freed through the `free_positions`
callback, and those of a rewritten value through `truncate_kv` (both the cache manager's), so no
slot bookkeeping lives here.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from runtime.api import VALUE_RETRIES_EXHAUSTED, TokenLogprob
from runtime.counters import EngineCounters
from runtime.decode.completeness import TEXT_TAIL
from runtime.decode.logprobs import forced_logprob, masked_log_softmax, token_logprobs
from runtime.decode.lookup import LookupDraft
from runtime.decode.penalties import adjust_logits_, hold_stop_
from runtime.decode.sampler import apply_token_bitmask, sample_token
from runtime.request import Req

JUMP_FORWARD_MODES = ("verify", "direct", "off")
SPECULATIVE_MODES = ("ngram", "off")
# Strict requests: choices re-drawn at most this often when they would overrun the budget
# (then the shortest completion path's next token is taken).
MAX_VETTED_CHOICES = 8

Finish = tuple[str, "str | None"]  # (finish_reason, error)
# Not a finish: the whole output broke a checked schema keyword and the matcher rolled back the
# failing value (grammar/checks/rollback.py); `Req.rewind_tokens` says how many tokens to drop.
REWIND = "rewind"


class Decoder:
    def __init__(
        self,
        eos_ids: set[int],
        max_jump_forward_tokens: int,
        counters: EngineCounters,
        free_positions: Callable[[Req, int, int], None],
        truncate_kv: Callable[[Req, int], None],
    ):
        self.eos_ids = eos_ids
        self.truncate_kv = truncate_kv
        self.max_jump_forward_tokens = max_jump_forward_tokens
        self.counters = counters
        self.free_positions = free_positions
        # logprob records of the last `first_choices` call (requests that asked), by rid
        self.first_logprobs: dict[str, TokenLogprob] = {}

    # ------------------------------------------------------------------ choosing

    def first_choices(
        self, logits: torch.Tensor | None, reqs: list[tuple[Req, int]], failed: dict[str, Exception]
    ) -> dict[str, int]:
        """Batched choice for greedy requests at their first logits row (the common decode path),
        on the device where the logits live. A request whose matcher raises is left out and its
        error put in `failed`. Records of requests asking for logprobs go to `first_logprobs`."""
        self.first_logprobs = {}
        greedy = [(r, row) for r, row in reqs if r.spec.sampling.greedy]
        if logits is None or not greedy:
            return {}
        sel = logits[torch.tensor([row for _, row in greedy], device=logits.device)]
        adjusted = [i for i, (r, _) in enumerate(greedy) if r.spec.sampling.adjusts_logits]
        for i in adjusted:
            r = greedy[i][0]
            adjust_logits_(sel[i], r.spec.sampling, r.prompt_ids, r.output_ids)
        constrained = [i for i, (r, _) in enumerate(greedy) if r.matcher is not None]
        if constrained:
            mask = torch.full((len(greedy), (sel.shape[-1] + 31) // 32), -1, dtype=torch.int32)
            for i in constrained:
                try:
                    self.fill_mask(greedy[i][0], mask, i)
                except Exception as e:
                    failed[greedy[i][0].rid] = e
            apply_token_bitmask(sel, mask, torch.tensor(constrained))
        for i in adjusted:
            hold_stop_(sel[i], greedy[i][0].spec.sampling, len(greedy[i][0].output_ids), self.eos_ids)
        asking = [i for i, (r, _) in enumerate(greedy) if r.spec.sampling.logprobs is not None]
        # before vetting, which changes rows of `sel` in place
        logp = masked_log_softmax(sel[torch.tensor(asking, device=sel.device)]) if asking else None
        choices = sel.argmax(dim=-1).tolist()
        for i, (r, _) in enumerate(greedy):
            if r.guard is not None and r.rid not in failed:
                choices[i] = self.vetted(r, sel[i], int(choices[i]))
        if logp is not None:
            records = token_logprobs(
                logp, [int(choices[i]) for i in asking], [greedy[i][0].spec.sampling.logprobs for i in asking]
            )
            self.first_logprobs = {greedy[i][0].rid: rec for i, rec in zip(asking, records)}
        return {r.rid: int(t) for (r, _), t in zip(greedy, choices) if r.rid not in failed}

    def vetted(self, r: Req, row: torch.Tensor, tok: int) -> int:
        """Strict requests: re-choose (from the same masked `row`, changed in place) while the
        choice would commit the output to more than the remaining budget can complete."""
        remaining = r.spec.sampling.max_new_tokens - len(r.output_ids)
        for _ in range(MAX_VETTED_CHOICES):
            if r.guard.allows(r.matcher, tok, remaining):
                return tok
            row[tok] = float("-inf")
            if not torch.isfinite(row).any():
                break
            tok = sample_token(row, r.spec.sampling, r.generator)
        if r.guard.allows(r.matcher, tok, remaining):
            return tok
        fallback = r.guard.fallback_token(r.matcher)
        return tok if fallback is None else fallback

    def fill_mask(self, r: Req, mask: torch.Tensor, row: int) -> None:
        """The grammar's mask for `r`'s next token, narrowed by closing / loop breaking if active."""
        if r.guard is None:
            r.matcher.fill_bitmask(mask, row)
            return
        r.guard.before_choice(r.matcher, len(r.output_ids), r.spec.sampling.max_new_tokens)
        r.guard.fill_mask(r.matcher, mask, row)

    def choose(self, r: Req, logits_row: torch.Tensor) -> tuple[int, TokenLogprob | None]:
        """The next token from one row, with its logprob record if the request asked for one."""
        row = logits_row.clone().unsqueeze(0)
        p = r.spec.sampling
        if p.adjusts_logits:
            adjust_logits_(row[0], p, r.prompt_ids, r.output_ids)
        if r.matcher is not None:
            mask = torch.full((1, (row.shape[-1] + 31) // 32), -1, dtype=torch.int32)
            self.fill_mask(r, mask, 0)
            apply_token_bitmask(row, mask)
        if p.adjusts_logits:
            hold_stop_(row[0], p, len(r.output_ids), self.eos_ids)
        top_count = r.spec.sampling.logprobs
        logp = masked_log_softmax(row) if top_count is not None else None
        tok = sample_token(row[0], r.spec.sampling, r.generator)
        if r.guard is not None:
            tok = self.vetted(r, row[0], tok)
        return tok, None if logp is None else token_logprobs(logp, [tok], [top_count])[0]

    # ------------------------------------------------------------------ accepting

    def accept_from_logits(
        self, r: Req, rows: torch.Tensor | None, fed: int, first_choice: int | None
    ) -> Finish | None:
        """After a pass that reached the end of `r`'s pending tokens: verify its draft (if any),
        choose the next token, roll back KV of rejected draft tokens, then plan the next draft.
        Returns the finish (reason, error) if `r` is done; the caller finishes it, after this KV
        bookkeeping, so no slot is left behind.

        Verifying a draft token is choosing at its position exactly as without a draft (masked,
        vetted, sampled with the request's generator) and keeping it if the choice equals it.
        Under sampling that accepts with the masked probability of the draft token and otherwise
        yields the residual distribution, as speculative sampling with a one-hot draft does; and
        since every position draws once, as it would without drafts, a seed gives the same output
        whatever was drafted."""
        draft, r.draft = r.draft, []
        looked_up = r.lookup.last_len if r.lookup is not None and draft else 0  # the draft's lookup tail
        kv_before = r.kv_len
        r.kv_len += fed - len(draft)  # real tokens now have KV; drafts count only once accepted
        accepted_draft = 0
        finish: Finish | None = None
        for i in range(len(draft) + 1):
            if i == 0 and first_choice is not None:
                tok, record = first_choice, self.first_logprobs.get(r.rid)
            else:  # a draft position's record is its verified logprob
                tok, record = self.choose(r, rows[i])
            finish = self.accept_token(r, tok, record)
            if i < len(draft) and tok == draft[i]:
                accepted_draft += 1
                if finish is None:
                    continue
            break
        r.kv_len += accepted_draft
        rejected = len(draft) - accepted_draft
        if rejected:
            start = kv_before + fed - rejected
            self.free_positions(r, start, start + rejected)
        r.pass_end = None
        if finish is not None and finish[0] == REWIND:
            self.rewind(r)
            finish = None
        forced = len(draft) - looked_up
        forced_accepted = min(accepted_draft, forced)
        self.counters.jump_forward_tokens += forced_accepted
        self.counters.jump_forward_rejected += forced - forced_accepted
        r.jump_forward_tokens += forced_accepted
        if looked_up:
            lookup_accepted = accepted_draft - forced_accepted
            self.counters.lookup_accepted_tokens += lookup_accepted
            self.counters.lookup_rejected_tokens += looked_up - lookup_accepted
            if accepted_draft >= forced:  # else its lookup tokens were never tried
                r.lookup.verified(looked_up, lookup_accepted)
        r.last_token_at = time.monotonic()
        if r.first_token_at is None:
            r.first_token_at = r.last_token_at
            self.counters.ttft_seconds_sum += r.first_token_at - r.arrival
        if finish is None:
            finish = self.plan_jump_forward(r)
        if finish is None and r.lookup is not None:
            self.plan_lookup(r)
        return finish

    def accept_token(self, r: Req, tok: int, record: TokenLogprob | None = None) -> Finish | None:
        """Append one output token, advance the grammar, check finish conditions. Returns
        (finish_reason, error) when the request is done; the caller finishes it. `record` (the
        token's logprob) is kept for tokens that have text: not for the final EOS / stop token."""
        if r.matcher is not None and not r.matcher.accept(tok):
            return "error", f"grammar rejected token {tok}"
        r.append_token(tok)
        r.unsent_ids.append(tok)
        self.counters.generated_tokens += 1
        p = r.spec.sampling
        # A value budget closing completed ends `stop`: it is whole and valid, and OpenAI clients
        # (`parse()`) refuse any `length` answer. The final event says the budget shaped it.
        if (tok in self.eos_ids and not p.ignore_eos) or tok in p.stop_token_ids:
            return self.whole(r)
        if r.matcher is not None and r.matcher.is_terminated():
            return self.whole(r)
        r.pending_text += r.detok.add([tok])
        if record is not None:
            r.unsent_logprobs.append(record)
        if r.guard is not None:
            r.guard.after_token(r.output_ids, r.detok.text[-TEXT_TAIL:], r.matcher.closes_value(tok))
        if r.detok.stopped:
            return "stop", None
        if len(r.output_ids) >= p.max_new_tokens:
            # strict closing may finish the value on the budget's last token, with no room left for
            # the stop token; a whole value is not a cut one
            if r.guard is not None and r.matcher.is_completed():
                return self.whole(r)
            return "length", None
        return None

    def whole(self, r: Req) -> Finish:
        """The output is complete: `stop`, unless the matcher's check of the whole value finds a
        keyword broken (then REWIND: it rolled the failing value back, to be written again) or its
        rewrites are spent (a request that refuses unfit output then fails rather than answer
        invalid; another finishes, for validation after generation to flag)."""
        if r.matcher is None:
            return "stop", None
        verdict = r.matcher.output_verdict()
        if verdict is None:
            return "stop", None
        if verdict > 0:
            r.rewind_tokens = verdict
            return REWIND, None
        self.counters.value_rewrites_exhausted += 1
        if not r.spec.refuse_unfit:
            return "stop", None
        return "error", (
            f"{VALUE_RETRIES_EXHAUSTED}: the output kept breaking a schema keyword that only the check of "
            "the finished value enforces, with every rewrite spent"
        )

    def rewind(self, r: Req) -> None:
        """Drop the last `r.rewind_tokens` output tokens (the matcher has rolled them back): their
        KV, text and logprobs. Nothing of them was sent (such outputs are withheld until whole).
        The last kept token is fed again, so the next pass gives the logits to rewrite from."""
        n, r.rewind_tokens = r.rewind_tokens, 0
        keep = len(r.output_ids) - n
        del r.output_ids[keep:]
        del r.token_ids[len(r.prompt_ids) + keep :]
        r.draft = []
        if r.lookup is not None:
            r.lookup.index.forget_from(len(r.token_ids))
        self.truncate_kv(r, len(r.token_ids) - 1)
        r.restart_text()
        if r.guard is not None:
            r.guard.restart()
        self.counters.value_rewrites += 1
        self.counters.rewritten_tokens += n

    def plan_lookup(self, r: Req) -> None:
        """Queue a prompt-lookup draft after the forced one (if any): tokens that followed the
        last occurrence of the output's latest n-gram (lookup.py), cut before a stop token and to
        what the grammar accepts, so no row is spent on a token the mask would refuse."""
        lk: LookupDraft = r.lookup
        lk.last_len = 0
        p = r.spec.sampling
        room = min(self.max_jump_forward_tokens, p.max_new_tokens - len(r.output_ids) - 1) - len(r.draft)
        draft = lk.propose(r.token_ids, r.draft, room)
        stop = next((i for i, t in enumerate(draft) if t in self.eos_ids or t in p.stop_token_ids), None)
        if stop is not None:
            draft = draft[:stop]
        if draft and r.matcher is not None:
            draft = draft[: max(0, r.matcher.valid_prefix(r.draft + draft) - len(r.draft))]
        if draft:
            r.draft = r.draft + draft
            lk.last_len = len(draft)
            self.counters.lookup_draft_tokens += len(draft)

    def plan_jump_forward(self, r: Req) -> Finish | None:
        """Queue the grammar's forced tokens: as a draft (verify) or as output (direct)."""
        if r.jump_forward == "off" or r.matcher is None:
            return None
        room = r.spec.sampling.max_new_tokens - len(r.output_ids) - 1
        cap = min(self.max_jump_forward_tokens, room)
        if cap <= 0:
            return None
        forced = r.matcher.jump_forward_tokens(learn=r.jump_forward == "verify")[:cap]
        if not forced:
            return None
        if r.jump_forward == "verify":
            r.draft = forced
            return None
        for tok in forced:  # direct: the grammar's tokens go in unverified (SGLang 2024)
            if r.guard is not None:
                # Strict: a forced span can be split into more tokens than its shortest form, so
                # near the budget the guard's closing plan, not the draft, chooses the next token.
                max_new = r.spec.sampling.max_new_tokens
                r.guard.before_choice(r.matcher, len(r.output_ids), max_new)
                if not r.guard.allows_unchosen(r.matcher, tok, max_new - len(r.output_ids)):
                    break
            self.counters.jump_forward_tokens += 1
            r.jump_forward_tokens += 1
            top_count = r.spec.sampling.logprobs
            finish = self.accept_token(r, tok, None if top_count is None else forced_logprob(tok, top_count))
            if finish is not None and finish[0] == REWIND:
                self.rewind(r)
                return None
            if finish is not None:
                return finish
        return None
