"""Benchmarks, run from a checkout as `python -m bench NAME` (not installed, not a `tfrp`
command); results and the commands that produced them are in RESULTS.md."""
