"""`sandcell mcp`: sandboxes as Model Context Protocol tools (SPEC §15), built on the SDK.

Imported only by the `sandcell mcp` command: the `mcp` package is an optional extra.
"""
