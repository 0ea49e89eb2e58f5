"""The Anthropic Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`).

A request is translated to the shared chat request (`translate`), served by the same preparation,
engine lifecycle and grammar as chat, and mapped back to content blocks (`results`, `events`);
errors leave in Anthropic's shape (`errors`).
"""
