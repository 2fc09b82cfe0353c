"""Benchmarks behind `tfrp bench`; results and the commands that produced them are in RESULTS.md."""
