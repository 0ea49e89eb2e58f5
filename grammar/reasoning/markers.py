"""The think markers of each reasoning format, and what a rendered prompt says about the block.

Qwen3 and DeepSeek-R1 style models write `<think>...</think>` before the answer (xgrammar's
`get_model_structural_tag` uses the same markers: Qwen3 ends the block with a blank line). A chat
template may open the block itself (the prompt ends with `<think>`: the output starts inside it),
close it empty (`enable_thinking: false` in Qwen3's template: no block is written), or leave it to
the model (the output starts with `<think>`).

gpt-oss (harmony) writes its reasoning as an analysis message, `<|channel|>analysis<|message|>...
<|end|>`, then either `<|start|>assistant<|channel|>final<|message|>` and the answer, or
`<|start|>assistant` and a tool call in its commentary channel (`<|channel|>commentary
to=functions.NAME ...`, the grammar xgrammar's harmony tool tag writes). The analysis message is
read as a think block with those markers; a request with tools stops the way out at
`<|start|>assistant` (`for_answer`), so the tool tag writes the channel. xgrammar's own harmony tag
with reasoning on puts the analysis message among the others in any order: as a block first, the
thinking budget and budget-aware closing apply to it, and response_format's grammar follows it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

OPEN = "open"  # the prompt opened the block: the output starts inside it
TO_COME = "to_come"  # the model writes the opening marker first
CLOSED = "closed"  # no block: the template closed it (thinking disabled) or the format has none


@dataclass(frozen=True)
class ThinkMarkers:
    begin: str
    end: str
    after: str  # what follows the end marker before the answer
    tools_after: str | None = None  # what follows it before tool calls, where that differs (harmony)
    closed: tuple[str, ...] = ()  # other prompt ends that mean no block (harmony's final channel opened)

    def for_answer(self, tools: bool) -> ThinkMarkers:
        """The markers of a request whose answer is tool calls (`tools`) or anything else."""
        if tools and self.tools_after is not None:
            return replace(self, after=self.tools_after)
        return self


HARMONY_START = "<|start|>assistant"
HARMONY_FINAL = "<|channel|>final<|message|>"

THINK_MARKERS = {
    "qwen_3": ThinkMarkers("<think>", "</think>", "\n\n"),
    "deepseek_r1": ThinkMarkers("<think>", "</think>", ""),
    "harmony": ThinkMarkers(
        "<|channel|>analysis<|message|>",
        "<|end|>",
        HARMONY_START + HARMONY_FINAL,
        tools_after=HARMONY_START,
        closed=(HARMONY_FINAL,),
    ),
}


def think_markers(reasoning_format: str) -> ThinkMarkers | None:
    """The markers of a think-block format (None: the format writes no think block)."""
    return THINK_MARKERS.get(reasoning_format)


def block_state(markers: ThinkMarkers, prompt_text: str) -> str:
    """Where the rendered prompt leaves the think block: OPEN, TO_COME or CLOSED."""
    tail = prompt_text.rstrip()
    if tail.endswith((markers.end, *markers.closed)):
        return CLOSED
    if tail.endswith(markers.begin):
        return OPEN
    return TO_COME


def think_tag(markers: ThinkMarkers, state: str) -> dict:
    """The structural tag of the block alone (free text up to the end marker, then `after`)."""
    block = {
        "type": "tag",
        "begin": "" if state == OPEN else markers.begin,
        "content": {"type": "any_text", "excludes": [markers.begin]},
        "end": markers.end,
    }
    if markers.after:
        block = {"type": "sequence", "elements": [block, {"type": "const_string", "value": markers.after}]}
    return {"format": block}
