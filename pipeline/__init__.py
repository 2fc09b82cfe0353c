"""Pipeline assembly, configuration, runners and the `tfrp` CLI."""
