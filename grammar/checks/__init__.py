"""Checks on what the model wrote: the value check and its rules, check-and-roll-back, closing plans, the strict
matcher methods."""
