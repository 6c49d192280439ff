"""The workspace and the file API on it (SPEC §2.4), every path confined beneath it."""
