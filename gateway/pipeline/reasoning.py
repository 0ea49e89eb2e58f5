"""A reasoning model's think block for one request: whether there is one, its budget, its grammar.

The served model's reasoning format (`--reasoning-format`, else read from its chat template)
names the think markers (grammar/reasoning/). After the prompt is rendered, the prompt's own end
says where the block stands: opened by the template, closed by it (`chat_template_kwargs:
{"enable_thinking": false}`, or `reasoning_effort: "none"`, which sets that variable), or still
to be written by the model. While there is a block:

- a request with a constraint (`response_format`, tools, ...) gets the block's grammar first and
  its own after it (`ThinkThenConstraint`), so the answer is constrained only once the block ends;
- the block has a thinking budget: `thinking_budget` (tokens, as given), else `reasoning_effort`'s
  share of `max_tokens` (minimal 1/8, low 1/4, medium 1/2, high 3/4), else for a constrained request
  half of `max_tokens`; a share never more than leaves room for the block's way out and the
  answer's shortest completion. A free-text request gets a budget only where it asked for one;
- the output is split into `reasoning_content` and the answer (`ReasoningPlan.splitter`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from gateway.errors import bad_request
from gateway.pipeline import grammar_adapter
from grammar.reasoning.markers import CLOSED, TO_COME, ThinkMarkers, block_state, think_markers, think_tag
from grammar.reasoning.sequence import ThinkThenConstraint
from grammar.reasoning.split import ReasoningSplitter

if TYPE_CHECKING:  # types only: importing grammar's service pulls in xgrammar
    from grammar import GrammarService
    from runtime.constraint import CompiledConstraint

EFFORT_SHARE = {"none": 0.0, "minimal": 0.125, "low": 0.25, "medium": 0.5, "high": 0.75}
CONSTRAINED_SHARE = EFFORT_SHARE["medium"]  # a constrained request that names no budget
ANSWER_MARGIN = 8  # tokens kept beyond the answer's shortest completion
HARMONY_EFFORTS = ("low", "medium", "high")  # the efforts gpt-oss's template names


@dataclass(frozen=True)
class ReasoningPlan:
    markers: ThinkMarkers
    state: str  # grammar.reasoning.markers: OPEN or TO_COME
    budget: int | None  # tokens of the block (None: unbounded)
    asked: bool = False  # the budget is the request's own `thinking_budget` (kept as given)

    def splitter(self) -> ReasoningSplitter:
        return ReasoningSplitter(self.markers, self.state)


def model_thinks() -> bool:
    """Whether the served model writes a think block this gateway separates."""
    return think_markers(grammar_adapter.reasoning_format_name()) is not None


def effort_kwargs(effort: str | None, template_kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
    """`reasoning_effort: "none"` turns thinking off in the template (Qwen3's `enable_thinking`);
    gpt-oss's template takes the effort itself (`Reasoning: low|medium|high` in its system
    message); unless the client set that variable itself."""
    name = grammar_adapter.reasoning_format_name()
    if name == "harmony" and effort in HARMONY_EFFORTS:
        return {"reasoning_effort": effort, **(template_kwargs or {})}
    if effort != "none" or think_markers(name) is None:
        return template_kwargs
    return {"enable_thinking": False, **(template_kwargs or {})}


def check_budget_fields(effort: str | None, budget: int | None, param: str = "thinking_budget") -> None:
    """A bad value, or a budget for a model that writes no think block (effort "none" is neutral)."""
    if not model_thinks() and ((effort is not None and effort != "none") or budget is not None):
        field = "reasoning_effort" if effort is not None and effort != "none" else param
        raise bad_request(
            f"'{field}' is not supported: the served model writes no think block "
            f"(reasoning format {grammar_adapter.reasoning_format_name()!r}; docs/reasoning.md).",
            field,
        )
    if effort is not None and effort not in EFFORT_SHARE:
        raise bad_request(
            f"'reasoning_effort' must be one of {', '.join(EFFORT_SHARE)}; got {effort!r}.", "reasoning_effort"
        )
    if budget is not None and budget < 0:
        raise bad_request(f"'{param}' must be 0 or more; got {budget}.", param)


def plan_reasoning(
    prompt_text: str | None,
    max_new: int,
    effort: str | None,
    budget: int | None,
    constrained: bool,
    tools: bool = False,
) -> ReasoningPlan | None:
    """The request's think block (None: the model writes none for this prompt); `tools`: the
    answer is tool calls (harmony then leaves the channel to the tool grammar)."""
    markers = think_markers(grammar_adapter.reasoning_format_name())
    if markers is None or prompt_text is None:
        return None
    markers = markers.for_answer(tools)
    state = block_state(markers, prompt_text)
    if state == CLOSED:
        return None
    asked = budget is not None
    if budget is None and effort is not None:
        budget = int(max_new * EFFORT_SHARE[effort])
    elif budget is None and constrained:
        budget = int(max_new * CONSTRAINED_SHARE)
    return ReasoningPlan(markers, state, budget, asked)


async def reasoning_constraint(
    plan: ReasoningPlan,
    answer: CompiledConstraint | None,
    service: GrammarService | None,
    tokenizer: Any,
    max_new: int,
) -> CompiledConstraint | None:
    """The request's constraint with the think block before it (`answer` None: free text after
    the block; the block then needs a grammar only for a budget)."""
    if answer is None and plan.budget is None:
        return None
    if service is None:
        return answer  # no grammar service: the block runs unbounded, split from the answer
    spec = grammar_adapter.make_spec("structural_tag", think_tag(plan.markers, plan.state))
    think = await grammar_adapter.compile_spec(service, spec)

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    opening = plan.markers.begin if plan.state == TO_COME else ""
    way_out = plan.markers.end + plan.markers.after
    constraint = ThinkThenConstraint(think, answer, opening, way_out, encode, plan.budget)
    need = await anyio.to_thread.run_sync(constraint.min_completion_tokens)  # plans: off the event loop
    if plan.budget is not None and not plan.asked and need is not None:
        # a default budget leaves room for the block's way out and the answer's shortest
        # completion; a budget the request gave is kept (a strict answer is still completed in
        # time by budget-aware closing, which counts both)
        room = max(0, max_new - need - ANSWER_MARGIN)
        constraint.budget = min(constraint.budget, room)
    return constraint
