"""Tests of gateway/chat/: the chat and completions routes, wire format, logprobs."""
