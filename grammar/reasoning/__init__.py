"""Reasoning models' think blocks: the markers of each reasoning format, the splitter that sends
the block apart from the answer, and the constraint that lets the block run free before a grammar.

- markers.py:  each format's think markers, and where a prompt leaves the block (open, closed, to come)
- split.py:    streamed text -> (reasoning piece, content piece)
- sequence.py: a think block, then the request's own grammar (one matcher for the runtime)
"""
