"""The engine: the step loop, the scheduler and its admission policies, requests and their intake, the engine thread."""
