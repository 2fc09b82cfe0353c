"""The compiled pipeline run task by task as Kubeflow Pipelines' launcher runs it
(`tests/kfp_launch.py`), with its pipeline root and serving folder on s3:// (Kubeflow on
MinIO): each task is its own process, started with the spec's command inside the object
stores' private network (`tests/object_stores.py`). The stock components write their
artifacts through tf.io.gfile, which reaches s3:// only through tensorflow-io, whose S3
client would abort every task's exit (status 134) unless the task's command ended it first
(`pipeline/task_entrypoint.py`)."""
from __future__ import annotations

import json
import os
import re
import sys

import kfp_launch
from test_object_storage import LISTING

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore", "TF_USE_LEGACY_KERAS": "1",
         "PYTHONPATH": ROOT}


def test_the_compiled_pipeline_runs_on_s3_task_by_task_and_pushes_to_the_bucket(
        object_stores, tmp_path):
    bucket = object_stores.make_bucket("s3", "kfp-minio")
    spec = str(tmp_path / "pipeline.json")
    compiled = object_stores.run(
        [sys.executable, "-m", "pipeline.cli", "compile", "--output", spec,
         "--pipeline-root", f"{bucket}/root", "--set", f"serving_dir={bucket}/serving",
         "--set", f"image_workdir={ROOT}"], cwd=str(tmp_path), env=QUIET, timeout=600)
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    failures = []

    def execute(command: list[str], image: str) -> int:
        assert command[:3] == ["python", "-m", "pipeline.task_entrypoint"], command[:3]
        result = object_stores.run([sys.executable, *command[1:]], cwd=str(tmp_path),
                                   env=QUIET, timeout=900)
        if result.returncode:
            failures.append(result.stderr[-5000:])
        return result.returncode

    try:
        tasks = kfp_launch.run_spec(spec, f"{bucket}/root", execute,
                                    outputs_dir=str(tmp_path / "outputs"))
    except kfp_launch.TaskFailed as failed:
        raise AssertionError(f"{failed}\n{''.join(failures)}") from None
    assert len(tasks) == 10 and all(t.startswith(f"{bucket}/root/") for t in tasks.values())
    listed = object_stores.run([sys.executable, "-c", LISTING, bucket], cwd=ROOT, env=QUIET,
                               timeout=300)
    objects = json.loads(listed.stdout)
    assert any(o.startswith(tasks["ShardedTransform"] + "/post_transform_schema/")
               for o in objects), objects
    assert any(re.match(rf"{bucket}/serving/\d+/saved_model\.pb$", o) for o in objects), \
        "no model was pushed to the bucket"
    assert not any(p.name.startswith("s3:") for p in tmp_path.rglob("*"))
    written = kfp_launch.executor_output(tasks, "Evaluator", str(tmp_path / "outputs"))
    (blessed,) = written["artifacts"]["blessing"]["artifacts"]
    assert blessed["metadata"]["blessed"] == 1, blessed
