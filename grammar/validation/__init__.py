"""A spec judged before compiling: JSON-schema and regex checks, and what each keyword gets (the fidelity table)."""
