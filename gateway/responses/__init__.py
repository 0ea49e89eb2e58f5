"""The OpenAI Responses API (`/v1/responses`): wire format, items <-> the chat path, events, the stored responses, the
route."""
