"""The command of every task of a compiled pipeline (Kubeflow Pipelines, Vertex AI): TFX's
Kubeflow v2 executor entrypoint, run after tf.io.gfile has been given s3:// for the URIs the
task's arguments name (stock components write their artifacts through it) and with the
process ending on the task's own exit status (components/tf_filesystems.py)."""
from __future__ import annotations

import runpy
import sys

from components import tf_filesystems

TFX_ENTRYPOINT = "tfx.orchestration.kubeflow.v2.container.kubeflow_v2_run_executor"


def main() -> None:
    tf_filesystems.register_for_arguments(sys.argv[1:])
    sys.argv[0] = TFX_ENTRYPOINT
    runpy.run_module(TFX_ENTRYPOINT, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
