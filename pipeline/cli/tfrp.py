"""`tfrp` as a process: the product's commands, each group's module adding its own."""
from __future__ import annotations

from pipeline import google_version_check, process_exit, tfx_components

process_exit.install()  # before the libraries register their exit handlers
tfx_components.defer_package_init()  # before anything imports TFX
google_version_check.skip_package_scan()  # before anything imports Google's clients

from pipeline.cli import deploy, records, runs, servers  # noqa: E402,F401  (their commands)
from pipeline.cli.group import main  # noqa: E402


def entry_point() -> None:
    """`tfrp` as a process, ending with the command's own exit status as soon as Python's
    exit handlers have run (pipeline/process_exit.py)."""
    process_exit.run(main)
