"""The suites of `python -m bench NAME`, one module each (listed in bench/__main__.py)."""
