"""The think markers of each reasoning format, and what a rendered prompt says about the block.

Qwen3 and DeepSeek-R1 style models write `<think>...</think>` before the answer (xgrammar's
`get_model_structural_tag` uses the same markers: Qwen3 ends the block with a blank line). A chat
template may open the block itself (the prompt ends with `<think>`: the output starts inside it),
close it empty (`enable_thinking: false` in Qwen3's template: no block is written), or leave it to
the model (the output starts with `<think>`). harmony's analysis channel is not a think block: its
tool-call parser reads it (grammar/kinds/tool_calls/).
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN = "open"  # the prompt opened the block: the output starts inside it
TO_COME = "to_come"  # the model writes the opening marker first
CLOSED = "closed"  # no block: the template closed it (thinking disabled) or the format has none


@dataclass(frozen=True)
class ThinkMarkers:
    begin: str
    end: str
    after: str  # what follows the end marker before the answer


THINK_MARKERS = {
    "qwen_3": ThinkMarkers("<think>", "</think>", "\n\n"),
    "deepseek_r1": ThinkMarkers("<think>", "</think>", ""),
}


def think_markers(reasoning_format: str) -> ThinkMarkers | None:
    """The markers of a think-block format (None: the format writes no think block)."""
    return THINK_MARKERS.get(reasoning_format)


def block_state(markers: ThinkMarkers, prompt_text: str) -> str:
    """Where the rendered prompt leaves the think block: OPEN, TO_COME or CLOSED."""
    tail = prompt_text.rstrip()
    if tail.endswith(markers.end):
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
