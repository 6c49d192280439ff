"""The in-cell daemon: runs commands and file operations for exactly one sandbox."""
