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


def top_suffices(r: Req) -> bool:
    """Whether a row's choice for `r` is its masked argmax and nothing else needs the masked row:
    greedy, without penalties or biases, without logprobs."""
    p = r.spec.sampling
    return p.greedy and not p.adjusts_logits and p.logprobs is None


def allows_bit(mask: torch.Tensor, row: int, token: int) -> bool:
    """Whether bit `token` of `mask[row]` is set (the grammar allows it)."""
    return bool((int(mask[row, token >> 5]) >> (token & 31)) & 1)


def gather_rows(logits: torch.Tensor, index: list[int]) -> torch.Tensor:
    """A copy of `logits[index]`. On the CPU through numpy, single-threaded: torch's OpenMP team
    stalls for milliseconds on a machine whose cores are busy (see sampler.apply_bitmask_)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return torch.from_numpy(logits.numpy()[index])
    return logits[torch.tensor(index, device=logits.device)]


def rows_argmax(rows: torch.Tensor) -> list[int]:
    """Each row's first maximal index (numpy's argmax and torch's agree: the first maximum)."""
    if rows.device.type == "cpu" and rows.dtype == torch.float32:
        return rows.numpy().argmax(axis=-1).tolist()
    return rows.argmax(dim=-1).tolist()


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
        # the unmasked argmax of each greedy request's draft rows in the last pass, by rid
        self.draft_tops: dict[str, list[int]] = {}

    # ------------------------------------------------------------------ choosing

    def first_choices(
        self, logits: torch.Tensor | None, reqs: list[tuple[Req, int]], failed: dict[str, Exception]
    ) -> dict[str, int]:
        """Batched choice for greedy requests at their first logits row (the common decode path),
        on the device where the logits live. A request whose matcher raises is left out and its
        error put in `failed`. Records of requests asking for logprobs go to `first_logprobs`.

        One argmax over every greedy row of the pass (first rows and draft rows) before any mask:
        a mask only removes tokens, so where it allows a row's unmasked argmax that token is the
        masked argmax too (ties: the first maximal index either way). Such a first row is never
        masked (vetting masks it only if it must re-choose), and a draft row's verification
        (`choose` with `top`) needs only its mask's bit (`draft_tops`)."""
        self.first_logprobs = {}
        self.draft_tops = {}
        greedy = [(r, row) for r, row in reqs if r.spec.sampling.greedy]
        if logits is None or not greedy:
            return {}
        drafted = [(r, row) for r, row in greedy if r.draft and top_suffices(r)]
        index = [row for _, row in greedy] + [row + 1 + k for r, row in drafted for k in range(len(r.draft))]
        picked = gather_rows(logits, index)
        tops = rows_argmax(picked)
        sel = picked[: len(greedy)]  # a view: the in-place changes below touch only these rows
        at = len(greedy)
        for r, _ in drafted:
            self.draft_tops[r.rid] = tops[at : at + len(r.draft)]
            at += len(r.draft)
        adjusted = [i for i, (r, _) in enumerate(greedy) if r.spec.sampling.adjusts_logits]
        for i in adjusted:
            r = greedy[i][0]
            adjust_logits_(sel[i], r.spec.sampling, r.prompt_ids, r.output_ids)
        constrained = [i for i, (r, _) in enumerate(greedy) if r.matcher is not None]
        mask, masked = None, []
        if constrained:
            mask = torch.full((len(greedy), (sel.shape[-1] + 31) // 32), -1, dtype=torch.int32)
            for i in constrained:
                try:
                    self.fill_mask(greedy[i][0], mask, i)
                except Exception as e:
                    failed[greedy[i][0].rid] = e
            masked = [i for i in constrained if not top_suffices(greedy[i][0]) or not allows_bit(mask, i, tops[i])]
            if masked:
                apply_token_bitmask(sel, mask, torch.tensor(masked))
        for i in adjusted:
            hold_stop_(sel[i], greedy[i][0].spec.sampling, len(greedy[i][0].output_ids), self.eos_ids)
        asking = [i for i, (r, _) in enumerate(greedy) if r.spec.sampling.logprobs is not None]
        # before vetting, which changes rows of `sel` in place
        logp = masked_log_softmax(sel[torch.tensor(asking, device=sel.device)]) if asking else None
        choices = tops[: len(greedy)]
        changed = sorted(set(masked) | set(adjusted)) if constrained else adjusted
        if changed:  # the rows the mask or the adjustments changed: their argmax again
            for i, t in zip(changed, rows_argmax(gather_rows(sel, changed))):
                choices[i] = t
        for i, (r, _) in enumerate(greedy):
            if r.guard is not None and r.rid not in failed:
                unmasked = mask is not None and i not in masked
                choices[i] = self.vetted(r, sel[i], int(choices[i]), mask if unmasked else None, i)
        if logp is not None:
            records = token_logprobs(
                logp, [int(choices[i]) for i in asking], [greedy[i][0].spec.sampling.logprobs for i in asking]
            )
            self.first_logprobs = {greedy[i][0].rid: rec for i, rec in zip(asking, records)}
        return {r.rid: int(t) for (r, _), t in zip(greedy, choices) if r.rid not in failed}

    def vetted(self, r: Req, row: torch.Tensor, tok: int, mask: torch.Tensor | None = None, mask_row: int = 0) -> int:
        """Strict requests: re-choose (from the same masked `row`, changed in place) while the
        choice would commit the output to more than the remaining budget can complete. `mask`:
        the row's grammar mask where `row` is not masked yet (its argmax was allowed); the row is
        then copied and masked before the first re-choice, so every re-choice draws from it."""
        remaining = r.spec.sampling.max_new_tokens - len(r.output_ids)
        for _ in range(MAX_VETTED_CHOICES):
            if r.guard.allows(r.matcher, tok, remaining):
                return tok
            if mask is not None:
                row = row.clone()
                apply_token_bitmask(row.unsqueeze(0), mask[mask_row : mask_row + 1])
                mask = None
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

    def choose(self, r: Req, logits_row: torch.Tensor, top: int | None = None) -> tuple[int, TokenLogprob | None]:
        """The next token from one row, with its logprob record if the request asked for one.
        `top`: the row's unmasked argmax (`draft_tops`, only where `top_suffices`); where the
        mask allows it, it is the choice without masking the row (see `first_choices`)."""
        if top is not None:
            mask = None
            if r.matcher is not None:
                mask = torch.full((1, (logits_row.shape[-1] + 31) // 32), -1, dtype=torch.int32)
                self.fill_mask(r, mask, 0)
            if mask is None or allows_bit(mask, 0, top):
                if r.guard is None:
                    return top, None
                return self.vetted(r, logits_row if mask is not None else logits_row.clone(), top, mask), None
        row = logits_row.clone().unsqueeze(0)
        p = r.spec.sampling
        if p.adjusts_logits:
            adjust_logits_(row[0], p, r.prompt_ids, r.output_ids)
        if r.matcher is not None:
            if top is None:
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
        tops = self.draft_tops.get(r.rid)  # the draft rows' unmasked argmax (greedy requests)
        looked_up = r.lookup.last_len if r.lookup is not None and draft else 0  # the draft's lookup tail
        kv_before = r.kv_len
        r.kv_len += fed - len(draft)  # real tokens now have KV; drafts count only once accepted
        accepted_draft = 0
        finish: Finish | None = None
        for i in range(len(draft) + 1):
            if i == 0 and first_choice is not None:
                tok, record = first_choice, self.first_logprobs.get(r.rid)
            else:  # a draft position's record is its verified logprob
                tok, record = self.choose(r, rows[i], tops[i - 1] if tops and i > 0 else None)
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
        room = r.spec.sampling.max_new_tokens - len(r.output_ids) if r.guard is not None else None
        verdict = r.matcher.output_verdict(room)
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
            r.lookup.forget_from(len(r.token_ids))
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
