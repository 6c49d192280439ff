"""The audit trail (SPEC §20): tamper-evident records of who did what, kept in the store as one
hash chain per writer, with `verify` to check them and retention that keeps them verifiable."""
