"""Jumpgate's HTTP face: an OpenAI-compatible Litestar app over the engine and the grammar service.

`gateway.app.create_app(engine, grammar_service, settings)` builds the app; `gateway.cli.main` is the
`jumpgate` command. Imports flow one way: gateway → grammar, runtime.
"""
