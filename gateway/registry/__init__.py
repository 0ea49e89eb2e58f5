"""The schema registry's surface (`/v1/schemas`): the route and pinned prefixes; the store is
gateway/pipeline/schema_registry.py."""
