"""Background processes and terminals (SPEC §9): the table, their output logs, attach."""
