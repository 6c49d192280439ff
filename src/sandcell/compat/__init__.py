"""Façades that translate foreign sandbox protocols into sandcell's own API."""
