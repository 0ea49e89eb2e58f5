"""`POST /v1/cache/explain`: how much of a request's prompt is already cached."""
