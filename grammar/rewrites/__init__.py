"""The exact rewrites (lowerings) a JSON schema goes through before compiling: oneOf, allOf, conditionals, negation,
listed values, formats, string algebra."""
