"""The XGrammar engine: compact JSON grammars, the tokenizer view, the per-request matcher."""
