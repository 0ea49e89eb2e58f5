"""The llguidance engine: JSON schemas as llguidance grammars, the tokenizer view, the per-request matcher."""
