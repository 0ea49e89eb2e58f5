"""End-to-end tests of the API surfaces beside chat: Responses, Messages, Batch."""
