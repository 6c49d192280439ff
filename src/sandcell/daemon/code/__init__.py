"""Code interpreter contexts (SPEC §10): stateful python and bash processes in the cell."""
