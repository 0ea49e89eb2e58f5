"""What every generating surface shares: request -> prompt, constraint and sampling params; engine lifecycle; output
validation."""
