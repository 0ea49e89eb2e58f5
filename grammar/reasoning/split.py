"""A model's output text split into its think block and the answer, whole or streamed.

Fed the output as it comes, `ReasoningSplitter.feed` returns (reasoning piece, content piece):
the markers themselves are in neither, and text that may still turn into a marker (`</thi`) is
held back until the next piece decides it. Where the block is still to come (TO_COME), the output
is reasoning only if it starts with the opening marker (after whitespace); else it is all content,
as vLLM's and SGLang's reasoning parsers read it.
"""

from __future__ import annotations

from grammar.reasoning.markers import CLOSED, OPEN, ThinkMarkers

_MAYBE, _THINK, _AFTER, _CONTENT = "maybe", "think", "after", "content"


def _held(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ReasoningSplitter:
    def __init__(self, markers: ThinkMarkers, state: str) -> None:
        self.markers = markers
        self.phase = {OPEN: _THINK, CLOSED: _CONTENT}.get(state, _MAYBE)
        self._buf = ""

    @property
    def thinking(self) -> bool:
        """Whether the output so far is (or may still be) inside the think block or its markers."""
        return self.phase != _CONTENT

    def feed(self, text: str) -> tuple[str, str]:
        self._buf += text
        reasoning: list[str] = []
        content: list[str] = []
        while self._buf:
            if self.phase == _CONTENT:
                content.append(self._buf)
                self._buf = ""
            elif self.phase == _MAYBE:
                lead = self._buf.lstrip()
                if lead.startswith(self.markers.begin):
                    self._buf = lead[len(self.markers.begin) :]
                    self.phase = _THINK
                elif self.markers.begin.startswith(lead):
                    break  # whitespace or part of the marker: not decided yet
                else:
                    self.phase = _CONTENT
            elif self.phase == _THINK:
                end = self._buf.find(self.markers.end)
                if end >= 0:
                    reasoning.append(self._buf[:end])
                    self._buf = self._buf[end + len(self.markers.end) :]
                    self.phase = _AFTER
                    continue
                keep = _held(self._buf, self.markers.end)
                reasoning.append(self._buf[: len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep :]
                break
            else:  # _AFTER: drop what the format writes between the block and the answer
                after = self.markers.after
                if self._buf.startswith(after):
                    self._buf = self._buf[len(after) :]
                    self.phase = _CONTENT
                elif after.startswith(self._buf):
                    break
                else:
                    self.phase = _CONTENT
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """What is still held back, once the output is over."""
        rest, self._buf = self._buf, ""
        if self.phase == _THINK:
            return rest, ""
        if self.phase == _AFTER:
            return "", ""
        return "", rest


def split_reasoning(markers: ThinkMarkers, state: str, text: str) -> tuple[str, str]:
    """(reasoning, content) of a whole output."""
    splitter = ReasoningSplitter(markers, state)
    r1, c1 = splitter.feed(text)
    r2, c2 = splitter.finish()
    return r1 + r2, c1 + c2
