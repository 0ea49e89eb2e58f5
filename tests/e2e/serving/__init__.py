"""End-to-end tests of the serving process: start-up errors, reliability over HTTP, shared folders."""
