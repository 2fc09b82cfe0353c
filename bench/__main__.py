"""`python -m bench NAME ...` runs a benchmark as its own process, set up as `tfrp` is."""
from pipeline import google_version_check, process_exit, tfx_components

process_exit.install()  # before the libraries register their exit handlers
tfx_components.defer_package_init()  # before anything imports TFX
google_version_check.skip_package_scan()  # before anything imports Google's clients

from bench.cli import bench  # noqa: E402

process_exit.run(lambda: bench(prog_name="python -m bench"))
