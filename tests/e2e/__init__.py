"""End-to-end tests against a real server (the session's one server, tests/conftest.py `jumpgate_server`, or one of
their own)."""
