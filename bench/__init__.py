"""sandcell benchmarks: each figure next to a baseline measured in the same run."""
