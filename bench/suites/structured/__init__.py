"""The structured-output suites: what grammar masks cost and buy (grammar), the two mask engines side
by side (grammar_engines), the value check (value_check), validation after generation (validation),
and strict answers to real-world schemas through a server (fidelity)."""
