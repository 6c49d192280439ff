"""Secrets that never enter the sandbox (SPEC §17): stored sealed outside every cell, given to a
sandbox as placeholders, substituted by the egress proxy over TLS towards the hosts they name."""
