"""The manager: sandbox lifecycle, two-stage init, warm pools and expiry (SPEC §4, §6)."""
