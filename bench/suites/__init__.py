"""The suites of `python -m bench NAME`, one module each (listed in bench/__main__.py): the engine
and the whole-server suites here, the KV-cache suites in kvcache/, the structured-output suites in
structured/ (so no package holds more than 12 modules)."""
