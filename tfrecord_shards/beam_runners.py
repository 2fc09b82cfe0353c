"""Which Beam runners run a pipeline inside the launching process. There a Beam job only adds
its start-up and per-element costs, so a stage may do its work in this process instead, or
in larger units. Read without importing Beam (3 s to import)."""
from __future__ import annotations

import argparse
from typing import Iterable, Optional

IN_PROCESS_RUNNERS = {"direct", "directrunner", "bundlebaseddirectrunner",
                      "switchingdirectrunner", "fnapirunner"}


def in_this_process(runner: Optional[str], direct_running_mode: Optional[str]) -> bool:
    """Whether `runner` (a name, or None for the default DirectRunner) runs the pipeline
    in this process: any DirectRunner but one in worker processes
    (`--direct_running_mode=multi_processing`)."""
    name = (runner or "DirectRunner").rsplit(".", 1)[-1].lower()
    return name in IN_PROCESS_RUNNERS and direct_running_mode != "multi_processing"


def args_in_this_process(beam_pipeline_args: Optional[Iterable[str]]) -> bool:
    """`in_this_process` for a pipeline built from these Beam args, read as Beam reads them
    (`--flag=value` or `--flag value`, the last one winning)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--runner")
    parser.add_argument("--direct_running_mode")
    known, _ = parser.parse_known_args([str(arg) for arg in beam_pipeline_args or []])
    return in_this_process(known.runner, known.direct_running_mode)
