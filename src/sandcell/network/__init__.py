"""Egress proxies outside the cell, their policies, and the relay to exposed ports (SPEC §11)."""
