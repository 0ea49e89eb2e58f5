"""The fidelity bench's parts: the real-world schema corpus, the client that asks a server for strict
answers, the classification of what came back, and the tally over a run."""
