"""Engine outcomes → OpenAI response bodies (whole responses; the streaming form is in streaming.py)."""

from __future__ import annotations

from msgspec import UNSET

from gateway.pipeline import grammar_adapter
from gateway.pipeline.generation import Outcome
from gateway.pipeline.logprobs import chat_logprobs, completion_logprobs
from gateway.pipeline.output_validation import OutputCheck
from gateway.pipeline.preparation import Prepared
from gateway.protocol import (
    ChatChoice,
    ChatCompletion,
    ChatMessage,
    ChoiceValidity,
    Completion,
    CompletionChoice,
    FunctionCall,
    ToolCall,
    Usage,
    make_usage,
)


def finish_reason(engine_reason: str | None, has_tool_calls: bool = False) -> str:
    if has_tool_calls:
        return "tool_calls"
    if engine_reason == "length":
        return "length"
    return "stop"


def usage_of(outcomes: list[Outcome]) -> Usage:
    """OpenAI counts the prompt once for n choices; completions (and their reasoning) add up."""
    first = outcomes[0]
    reasoning = sum(o.reasoning_tokens for o in outcomes) if first.reasoning is not None else None
    return make_usage(first.prompt_tokens, sum(o.completion_tokens for o in outcomes), first.cached_tokens, reasoning)


def reasoning_field(outcome: Outcome):
    """`reasoning_content` of a choice: the think block's text (null where the model wrote none;
    left out where the request could have none)."""
    if outcome.reasoning is None:
        return UNSET
    return outcome.reasoning or None


def chat_choice(
    index: int,
    outcome: Outcome,
    parse_tools: bool,
    check: OutputCheck | None = None,
    answer_tool: str | None = None,
    tools: list | None = None,
) -> ChatChoice:
    """`tools`: the request's, to type arguments a model format writes as markup."""
    if parse_tools:
        content, calls = grammar_adapter.parse_tool_calls(outcome.text, tools)
        answers = [c for c in calls if c.name == answer_tool]  # the final answer, as content
        if answers:
            content = (content or "") + "".join(c.arguments for c in answers)
            calls = [c for c in calls if c.name != answer_tool]
            if not calls:
                return ChatChoice(
                    index=index,
                    message=ChatMessage(content=content, reasoning_content=reasoning_field(outcome)),
                    finish_reason=finish_reason(outcome.finish_reason),  # type: ignore[arg-type]
                    jumpgate=_calls_validity(check, outcome, answers) or UNSET,
                )
        if calls:
            tool_calls = [ToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments)) for c in calls]
            return ChatChoice(
                index=index,
                message=ChatMessage(
                    content=content or None, tool_calls=tool_calls, reasoning_content=reasoning_field(outcome)
                ),
                logprobs=chat_logprobs(outcome.logprobs, outcome.token_texts),
                finish_reason="tool_calls" if outcome.finish_reason != "length" else "length",  # type: ignore[arg-type]
                jumpgate=_calls_validity(check, outcome, calls) or UNSET,
            )
    return ChatChoice(
        index=index,
        message=ChatMessage(content=outcome.text, reasoning_content=reasoning_field(outcome)),
        logprobs=chat_logprobs(outcome.logprobs, outcome.token_texts),
        finish_reason=finish_reason(outcome.finish_reason),  # type: ignore[arg-type]
        jumpgate=choice_validity(check, outcome, False) or UNSET,
    )


def choice_validity(
    check: OutputCheck | None, outcome: Outcome, parse_tools: bool, tools: list | None = None
) -> ChoiceValidity | None:
    """The jumpgate validity of one finished choice (None: nothing structured to validate)."""
    if parse_tools:
        return _calls_validity(check, outcome, grammar_adapter.parse_tool_calls(outcome.text, tools)[1])
    if check is None or check.kind != "json_schema":
        return None
    return _noted(check.check_text(outcome.text, outcome.finish_reason), outcome)


def _calls_validity(check: OutputCheck | None, outcome: Outcome, calls: list) -> ChoiceValidity | None:
    if check is None:
        return None
    return _noted(check.check_tool_calls([(c.name, c.arguments) for c in calls], outcome.finish_reason), outcome)


def _noted(validity: ChoiceValidity | None, outcome: Outcome) -> ChoiceValidity | None:
    """The verdict, saying also whether strict closing shaped the value."""
    if validity is not None and outcome.closed_at_budget:
        validity.closed_at_budget = True
    return validity


def chat_completion(prepared: Prepared, outcomes: list[Outcome], answer_tool: str | None = None) -> ChatCompletion:
    """`answer_tool`: the final-answer tool of a request with tools and a format (gateway.pipeline.answer_tool)."""
    return ChatCompletion(
        id=prepared.request_id,
        created=prepared.created,
        model=prepared.model,
        choices=[
            chat_choice(i, o, prepared.plan.parse_tool_calls, prepared.output_check, answer_tool, prepared.plan.tools)
            for i, o in enumerate(outcomes)
        ],
        usage=usage_of(outcomes),
    )


def completion(
    request_id: str,
    created: int,
    model: str,
    outcomes: list[Outcome],
    n: int,
    echo_texts: list[str | None],
    check: OutputCheck | None = None,
) -> Completion:
    """Choices for p prompts × n samples (index = prompt * n + sample), as OpenAI numbers them."""
    choices = []
    for index, outcome in enumerate(outcomes):
        prefix = echo_texts[index // n] or ""
        validity = choice_validity(check, outcome, False)
        choices.append(
            CompletionChoice(
                index=index,
                text=prefix + outcome.text,
                finish_reason=finish_reason(outcome.finish_reason),  # type: ignore[arg-type]
                logprobs=completion_logprobs(outcome.logprobs, outcome.token_texts, len(prefix)),
                jumpgate=validity or UNSET,
            )
        )
    prompt_tokens = sum(outcomes[p * n].prompt_tokens for p in range(len(outcomes) // n))
    cached = sum(outcomes[p * n].cached_tokens for p in range(len(outcomes) // n))
    return Completion(
        id=request_id,
        created=created,
        model=model,
        choices=choices,
        usage=make_usage(prompt_tokens, sum(o.completion_tokens for o in outcomes), cached),
    )
