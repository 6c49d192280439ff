"""The router: the one endpoint users call (SPEC §5)."""
