"""Installs testsupport's fault hook in a Python process started with this folder first on
PYTHONPATH (`testsupport.faults.child_env`); the hook does nothing unless TFRP_INJECT_FAULT
is set."""
from testsupport import faults

faults.install()
