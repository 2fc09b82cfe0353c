"""`tfrp` as a process: the product's commands and the benchmarks under one group."""
from __future__ import annotations

from pipeline import process_exit
from pipeline.cli.bench import bench
from pipeline.cli.commands import main

main.add_command(bench)


def entry_point() -> None:
    """`tfrp` as a process, ending with the command's own exit status whatever native
    libraries do at exit (pipeline/process_exit.py)."""
    process_exit.keep_exit_status()
    main()
