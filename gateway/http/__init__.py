"""HTTP plumbing every route shares: the access log, the request body class."""
