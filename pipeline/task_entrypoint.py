"""The command of every task of a compiled pipeline (Kubeflow Pipelines, Vertex AI): the
run's settings (`run_settings.py`) when its first argument is that task's flag, else TFX's
Kubeflow v2 executor entrypoint, run

- with each input artifact's type taken from the task's own input definitions (the spec's
  `--json_serialized_inputs_spec_args`) where the executor input carries none: open-source
  Kubeflow Pipelines' driver rebuilds input artifacts from ML Metadata with an empty type
  (`Schema: ""`), and TFX's entrypoint cannot find the artifact's class without it
  (tensorflow/tfx#7768); Vertex passes the types on, and they are then left as they are;
- with only the output artifacts the component declares (`--declared_outputs`, written by
  the compiler): open-source Kubeflow Pipelines (2.5 and later, `PUBLISH_LOGS` on by
  default) adds an `executor-logs` output of type `system.Artifact` to every task
  (backend/src/v2/driver/driver.go, provisionOutputs), which its launcher writes itself and
  TFX's entrypoint cannot import ("Could not import system.Artifact");
- with `minio://` URIs (open-source KFP's default pipeline root) read as the `s3://` objects
  they are: the stores' endpoint comes from the environment (AWS_ENDPOINT_URL), and
  tf.io.gfile has no minio:// scheme;
- after tf.io.gfile has been given s3:// for the URIs the task's arguments name (stock
  components write their artifacts through it, tfrecord_shards/tf_filesystems.py), with the
  process ending on the task's own exit status (pipeline/process_exit.py);
- with the objects its executor's module and its libraries (TensorFlow, TFX, Beam) leave
  alive kept out of the garbage collector's passes (`memory.objects_frozen`), as a local run
  runs every component: a task is a process of its own, with no local runner to do it.
"""
from __future__ import annotations

import importlib
import json
import runpy
import sys
from typing import Optional

from pipeline import google_version_check, process_exit, tfx_components

process_exit.install()  # before the libraries register their exit handlers
tfx_components.defer_package_init()  # before anything imports TFX
google_version_check.skip_package_scan()  # before anything imports Google's clients

from tfrecord_shards import tf_filesystems  # noqa: E402
from tfrecord_shards.memory import objects_frozen  # noqa: E402
from pipeline import run_settings  # noqa: E402

TFX_ENTRYPOINT = "tfx.orchestration.kubeflow.v2.container.kubeflow_v2_run_executor"
INVOCATION_FLAG = "--json_serialized_invocation_args"
INPUTS_SPEC_FLAG = "--json_serialized_inputs_spec_args"
OUTPUTS_FLAG = "--declared_outputs"  # ours: a JSON list of the component's output names
EXECUTOR_FLAG = "--executor_class_path"


def with_declared_outputs(args: list[str]) -> list[str]:
    """`args` without OUTPUTS_FLAG and its value, and with the executor input's outputs
    limited to the names it lists (all of them without the flag)."""
    if OUTPUTS_FLAG not in args:
        return args
    at = args.index(OUTPUTS_FLAG)
    declared = set(json.loads(args[at + 1]))
    args = [*args[:at], *args[at + 2:]]
    if INVOCATION_FLAG not in args:
        return args
    at = args.index(INVOCATION_FLAG) + 1
    invocation = json.loads(args[at])
    outputs = invocation.get("outputs", {}).get("artifacts", {})
    if set(outputs) <= declared:
        return args
    invocation["outputs"]["artifacts"] = {name: artifacts for name, artifacts in outputs.items()
                                          if name in declared}
    return [*args[:at], json.dumps(invocation), *args[at + 1:]]


def minio_as_s3(args: list[str]) -> list[str]:
    """`args` with every minio:// URI written as s3://, the scheme both file layers know."""
    return [arg.replace("minio://", "s3://") for arg in args]


def with_input_types(args: list[str]) -> list[str]:
    """`args` with every untyped input artifact of the executor input given the type its
    task's input definitions declare."""
    if INVOCATION_FLAG not in args or INPUTS_SPEC_FLAG not in args:
        return args
    at, spec_at = args.index(INVOCATION_FLAG) + 1, args.index(INPUTS_SPEC_FLAG) + 1
    invocation = json.loads(args[at])
    declared = json.loads(args[spec_at]).get("artifacts", {})
    changed = False
    for name, listed in invocation.get("inputs", {}).get("artifacts", {}).items():
        artifact_type = declared.get(name, {}).get("artifactType")
        for artifact in listed.get("artifacts", []):
            if artifact_type and not (artifact.get("type") or {}).get(
                    "instanceSchema", (artifact.get("type") or {}).get("schemaTitle")):
                artifact["type"] = artifact_type
                changed = True
    if not changed:
        return args
    return [*args[:at], json.dumps(invocation), *args[at + 1:]]


def executor_module(args: list[str]) -> Optional[str]:
    """The module of the executor class the arguments name (`--executor_class_path X` or
    `--executor_class_path=X`), or None."""
    for at, arg in enumerate(args):
        if arg == EXECUTOR_FLAG and at + 1 < len(args):
            return args[at + 1].rpartition(".")[0] or None
        if arg.startswith(EXECUTOR_FLAG + "="):
            return arg.partition("=")[2].rpartition(".")[0] or None
    return None


def main() -> None:
    process_exit.run(_task)


def _task() -> None:
    args = minio_as_s3(sys.argv[1:])
    if args[:1] == [run_settings.FLAG]:
        run_settings.main(args[1:])
        return
    args = with_input_types(with_declared_outputs(args))
    tf_filesystems.register_for_arguments(args)
    sys.argv = [TFX_ENTRYPOINT, *args]
    # Imported before the freeze, so that what the collector's full passes walk is the
    # task's own objects and not the 600,000 and more the libraries leave alive. Not TFX's
    # entrypoint itself: runpy runs it afresh and warns when it is already imported.
    module = executor_module(args)
    if module:
        importlib.import_module(module)
    with objects_frozen():
        runpy.run_module(TFX_ENTRYPOINT, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
