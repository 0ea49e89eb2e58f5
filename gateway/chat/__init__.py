"""The chat and text completions API (`/v1/chat/completions`, `/v1/completions`): routes, bodies, SSE, the generating
routes' lifecycle."""
