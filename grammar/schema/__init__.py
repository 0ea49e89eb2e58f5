"""The schema as data, before any rewrite: size limits, `$ref`/keyword walking, canonical form."""
