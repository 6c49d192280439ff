"""Kernel isolation layers of a cell: seccomp, Landlock and cgroups (SPEC §3)."""
