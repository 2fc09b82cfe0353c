"""The runners: LocalDagRunner with caching and blessing, the Kubeflow v2 compile, the Vertex
submit dry run, the image pipeline, and the settings they share."""
from __future__ import annotations

import collections
import csv
import gc
import glob
import json
import os
import re
import socket
import subprocess
import sys
import tempfile

import pytest
import tensorflow as tf
import yaml

from conftest import tfrp, tfrp_concurrently
from pipeline import local_runner, vertex_runner
from pipeline.configs import (CONTAINER_WORKDIR, DEFAULT_IMAGE, DEFAULT_IMAGE_TAG,
                              PipelineConfig)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPONENTS = {"ShardedExampleGen", "StatisticsGen", "ImportSchemaGen", "ExampleValidator",
              "ShardedTransform", "production_model", "Trainer", "Evaluator", "Pusher"}
# The compiled pipeline's own first task: each run's settings (pipeline/run_settings.py).
RUN_SETTINGS = "run-settings"
BEAM_ARGS = ["--runner=DataflowRunner", "--project=test-project", "--region=europe-west4",
             "--temp_location=gs://test-bucket/tmp", "--machine_type=n2-standard-4",
             "--max_num_workers=7"]


# -- LocalDagRunner: Evaluator, Pusher, cache ----------------------------------------------------
@pytest.fixture(scope="module")
def taxi_rerun(taxi_cli_rerun):
    return taxi_cli_rerun[0]


@pytest.fixture(scope="module")
def taxi_unblessed_run(taxi_run, taxi_rerun):
    """The same pipeline with an accuracy bound no model can reach."""
    config, _ = taxi_run
    return local_runner.run(config.replace(min_accuracy=1.01))


@pytest.mark.pipeline
def test_memory_is_released_after_every_component_of_a_local_run(taxi_run, taxi_rerun,
                                                                  monkeypatch):
    """Each component launched, cached or run, is followed by a release; the arenas, when
    set, are limited, and the free memory each keeps capped when set, before the first; the
    launcher is as TFX made it once the run is over.
    Every component runs with the objects imported before the run frozen (TensorFlow's and
    TFX's: hundreds of thousands), unfrozen once the run is summarised, and the summary reads
    each Examples manifest once."""
    from tfx.orchestration.portable import launcher
    from pipeline import run_summary

    config, _ = taxi_run
    released, limits, caps, frozen, reads = [], [], [], [], collections.Counter()
    release, limit = local_runner.release_free_memory, local_runner.limit_arenas
    monkeypatch.setattr(local_runner, "release_free_memory",
                        lambda: released.append(1) or frozen.append(gc.get_freeze_count())
                        or release())
    monkeypatch.setattr(local_runner, "limit_arenas",
                        lambda count: limits.append((count, len(released))) or limit(count))
    # Recorded, not applied: a cap would slow the rest of this test process (its effect is
    # tests/test_memory.py's, in processes of their own).
    monkeypatch.setattr(local_runner, "cap_kept_free_memory",
                        lambda size: caps.append((size, len(released))))
    read_manifest = run_summary.read_manifest
    monkeypatch.setattr(run_summary, "read_manifest",
                        lambda uri: reads.update([uri]) or read_manifest(uri))
    original = launcher.Launcher.launch
    # A bound no model reaches: nothing is pushed, so the later tests' production is as was.
    summary = local_runner.run(config.replace(min_accuracy=1.02, allocator_arenas=4,
                                              allocator_kept_free_bytes=4 << 20))
    assert summary.components["Evaluator"] == "ran" and not summary.blessed
    assert len(released) == len(summary.components) > 5
    assert limits == [(4, 0)]
    assert caps == [(4 << 20, 0)]
    assert launcher.Launcher.launch is original
    assert min(frozen) > 100_000, frozen
    assert gc.get_freeze_count() == 0
    assert reads and set(reads.values()) == {1}, reads


@pytest.mark.pipeline
def test_first_run_evaluates_blesses_and_pushes(taxi_run):
    config, summary = taxi_run
    assert summary.components == dict.fromkeys(summary.components, "ran")
    assert set(summary.components) == COMPONENTS
    assert summary.blessed is True
    assert 0.5 <= summary.evaluation["binary_accuracy"] <= 1
    assert summary.evaluation["example_count"] == summary.rows_per_split["eval"]
    assert summary.pushed_model.startswith(os.path.abspath(config.resolved_serving_dir))
    assert os.listdir(summary.pushed_model)


@pytest.mark.pipeline
def test_a_local_run_leaves_no_packaged_tfx_in_the_temp_folder(taxi_cli_run):
    """TFX packs its own source for remote Beam workers unless told what they run; a local
    run must not leave a 52 MB sdist per Beam component behind in the temp folder."""
    _, summary, result = taxi_cli_run
    assert summary.components["Evaluator"] == "ran"  # the Beam executors ran in this run
    left = [os.path.join(folder, name) for folder, _, names in os.walk(result.temp_dir)
            for name in names]
    assert not [path for path in left if "tfx_ephemeral" in path], left[:5]
    assert sum(os.path.getsize(path) for path in left) < 5_000_000, left[:20]


@pytest.mark.pipeline
def test_second_run_reuses_the_model_and_compares_it_with_production(taxi_run, taxi_rerun):
    """Nothing new: every component up to the Trainer is reused. The production model and
    the Evaluator run again, because production changed: the first run's push is now the
    model in production, so the same model is compared with itself, blessed, and pushed
    again."""
    _, first = taxi_run
    assert taxi_rerun.run_id != first.run_id
    again = {"production_model", "Evaluator", "Pusher"}
    reused = COMPONENTS - again
    assert taxi_rerun.components == {**dict.fromkeys(reused, "cached"),
                                     **dict.fromkeys(again, "ran")}
    assert f"Reused from cache: {len(reused)} of {len(COMPONENTS)}" in taxi_rerun.format()
    assert taxi_rerun.resolvers == []
    assert len(first.artifacts["Model"]) == 1  # the Trainer's: production's is a copy
    assert first.baseline_model is None
    assert taxi_rerun.baseline_model == first.pushed_model
    assert taxi_rerun.blessed
    assert taxi_rerun.baseline_evaluation["binary_accuracy"] == pytest.approx(
        taxi_rerun.evaluation["binary_accuracy"])


@pytest.mark.pipeline
def test_unblessed_model_is_not_pushed(taxi_run, taxi_rerun, taxi_unblessed_run):
    config, first = taxi_run
    summary = taxi_unblessed_run
    # Only the bound changed: the model is reused, then judged again and refused.
    assert summary.components["Trainer"] == "cached"
    assert summary.components["Evaluator"] == "ran" and summary.components["Pusher"] == "ran"
    assert summary.blessed is False
    assert summary.validation_failures == [
        f"binary_accuracy={summary.evaluation['binary_accuracy']:.4g}: outside its bound"]
    assert summary.pushed_model is None
    assert "Pushed model: not pushed" in summary.format()
    serving = os.path.abspath(config.resolved_serving_dir)
    # What the serving folder holds is what the two blessed runs before pushed.
    assert sorted(os.listdir(serving)) == sorted(
        os.path.basename(run.pushed_model) for run in (first, taxi_rerun))


# -- Kubeflow Pipelines v2 compile and Vertex AI submit ------------------------------------------
@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    folder = tmp_path_factory.mktemp("compiled")
    settings = folder / "settings.yaml"
    settings.write_text("beam_runner: DataflowRunner\n"
                        "dataflow_project: test-project\n"
                        "dataflow_region: europe-west4\n"
                        "dataflow_temp_location: gs://test-bucket/tmp\n"
                        "dataflow_machine_type: n2-standard-4\n"
                        "pipeline_root: gs://test-bucket/root\n")
    output = folder / "build" / "pipeline.json"
    result = tfrp("compile", "--target", "kubeflow", "--output", str(output),
                  "--config", str(settings), "--set", "dataflow_max_num_workers=7",
                  "--image-tag", "7.7.7")
    assert str(output) in result.stdout
    return output


@pytest.mark.slow
def test_compiled_json_loads_with_kfp_and_names_every_component(compiled):
    from kfp import components

    pipeline = components.load_component_from_file(str(compiled))
    assert pipeline.name == "tfrp-taxi"
    assert set(pipeline.pipeline_spec.root.dag.tasks) == COMPONENTS | {RUN_SETTINGS}
    assert pipeline.pipeline_spec.default_pipeline_root == "gs://test-bucket/root"


@pytest.mark.slow
def test_compiled_json_is_a_pipeline_spec_under_a_strict_parse(compiled):
    """Every field of the file is a PipelineSpec field (no unknown field is let through) of
    schema 2.1, with no `resolver` executor (open-source Kubeflow Pipelines runs none) and
    no `constantValue` parameter (it takes only 2.1's plain constants)."""
    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2

    spec = json_format.ParseDict(json.loads(compiled.read_text()),
                                 pipeline_spec_pb2.PipelineSpec(), ignore_unknown_fields=False)
    assert spec.schema_version == "2.1.0"
    executors = json.loads(compiled.read_text())["deploymentSpec"]["executors"]
    assert all(list(executor) == ["container"] for executor in executors.values()), executors
    assert "constantValue" not in compiled.read_text()
    for never_cached in ("production_model", RUN_SETTINGS):
        assert spec.root.dag.tasks[never_cached].caching_options.enable_cache is False


@pytest.mark.slow
def test_a_window_of_spans_is_refused_by_the_kubeflow_compile_in_one_line(tmp_path):
    """TFX's Kubeflow v2 compiler cannot compile stock's span resolver: said in one line,
    and no file is left that looks compiled."""
    output = tmp_path / "pipeline.json"
    result = tfrp("compile", "--target", "kubeflow", "--output", str(output),
                  "--set", "spans=3", check=False)
    assert result.returncode != 0 and not output.exists()
    line = result.stderr.strip().splitlines()[-1]
    assert "spans=3" in line and "SpanRangeStrategy" in line and "LocalDagRunner" in line, line


@pytest.mark.slow
def test_every_component_runs_the_configured_image_with_beam_args(compiled):
    spec = json.loads(compiled.read_text())
    executors = spec["deploymentSpec"]["executors"]
    assert {name.removesuffix("_executor") for name in executors} == \
        COMPONENTS | {RUN_SETTINGS}
    for name, executor in executors.items():
        container = executor["container"]
        assert container["image"] == f"{DEFAULT_IMAGE}:7.7.7", name
        if name == f"{RUN_SETTINGS}_executor":
            continue  # no Beam in it
        for arg in BEAM_ARGS + [f"--sdk_container_image={DEFAULT_IMAGE}:7.7.7"]:
            assert arg in container["args"], (name, arg)


@pytest.mark.slow
def test_compiled_pipeline_reads_container_paths(compiled):
    """Nothing in the spec may point at this machine: data is named, serving is on GCS."""
    text = compiled.read_text()
    assert ROOT not in text and "site-packages" not in text and "tfrp_runs" not in text
    assert "bundled:taxi" in text
    assert "gs://test-bucket/root/serving" in text


@pytest.mark.slow
def test_submit_dry_run_builds_the_job_from_the_compiled_json(compiled):
    result = tfrp("submit", "--template", str(compiled), "--project", "test-project",
                  "--region", "europe-west4", "--pipeline-root", "gs://test-bucket/run-1",
                  "--service-account", "runner@test-project.iam.gserviceaccount.com",
                  "--dry-run")
    job = json.loads(result.stdout)
    assert job["pipelineSpec"] == json.loads(compiled.read_text())
    assert job["runtimeConfig"]["gcsOutputDirectory"] == "gs://test-bucket/run-1"
    assert job["serviceAccount"] == "runner@test-project.iam.gserviceaccount.com"
    assert job["displayName"] == "tfrp-taxi"


@pytest.mark.slow
def test_dry_run_job_needs_no_network_and_no_credentials(compiled, monkeypatch, tmp_path):
    def refuse(*args, **kwargs):
        raise AssertionError(f"network used: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/credentials.json")
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    job = vertex_runner.dry_run_job(str(compiled), "test-project", "europe-west4",
                                    "gs://test-bucket/run-2")
    assert job.credentials.__class__.__name__ == "AnonymousCredentials"
    assert vertex_runner.describe(job)["pipelineSpec"] == json.loads(compiled.read_text())
    # The job's copy of the spec is read when the job is made and not left behind.
    assert list(temp.iterdir()) == []


@pytest.mark.slow
def test_submit_sets_runtime_parameters_typed_as_the_spec_declares_them(compiled):
    """`tfrp submit --param` sets the root's runtime parameters on the job, each typed as the
    compiled spec declares it, which the compile gave the compiled values as defaults."""
    result = tfrp("submit", "--template", str(compiled), "--project", "test-project",
                  "--region", "europe-west4", "--pipeline-root", "gs://test-bucket/run-3",
                  "--dry-run", "--param", "train_steps=7", "--param", "data_root=gs://x/y")
    job = json.loads(result.stdout)
    assert job["runtimeConfig"]["parameterValues"] == {"train_steps": 7, "data_root": "gs://x/y"}
    declared = job["pipelineSpec"]["root"]["inputDefinitions"]["parameters"]
    assert declared["train_steps"] == {"parameterType": "NUMBER_INTEGER", "defaultValue": 1000}
    assert declared["data_root"] == {"parameterType": "STRING", "defaultValue": "bundled:taxi"}
    assert declared["serving_dir"]["defaultValue"] == "gs://test-bucket/root/serving"
    assert {"eval_steps", "min_accuracy", "min_auc", "baseline_tolerance"} <= set(declared)
    wrong = tfrp("submit", "--template", str(compiled), "--project", "p", "--region", "r",
                 "--pipeline-root", "gs://b/r", "--dry-run", "--param", "train_stpes=7",
                 check=False)
    assert wrong.returncode != 0
    assert wrong.stderr.strip().splitlines()[-1] == (
        f"Error: {compiled} takes no runtime parameter 'train_stpes'; it takes "
        "baseline_tolerance, data_root, eval_steps, min_accuracy, min_auc, serving_dir, "
        "train_steps")
    typed = tfrp("submit", "--template", str(compiled), "--project", "p", "--region", "r",
                 "--pipeline-root", "gs://b/r", "--dry-run", "--param", "train_steps=many",
                 check=False)
    assert typed.stderr.strip().splitlines()[-1] == \
        "Error: --param train_steps=many: train_steps is an integer"


@pytest.mark.slow
def test_runtime_parameters_reach_the_tasks_through_the_run_settings_task(compiled, tmp_path):
    """The run-settings task applies a run's parameters to the tasks that use them, as KFP
    hands them to it (its executor input), and settles ExampleGen's source."""
    spec = json.loads(compiled.read_text())
    task = spec["root"]["dag"]["tasks"][RUN_SETTINGS]
    values = {name: value["runtimeValue"]["constant"]
              for name, value in task["inputs"]["parameters"].items() if "runtimeValue" in value}
    data = tmp_path / "data"
    data.mkdir()
    (data / "trips.csv").write_text("a,b\n1,2\n")
    values.update(train_steps=7, min_accuracy=0.9, baseline_tolerance=0.05,
                  serving_dir="gs://elsewhere/serving", data_root=str(data))
    executor_input = {"inputs": {"parameterValues": values},
                      "outputs": {"outputFile": str(tmp_path / "out" / "output.json")}}
    subprocess.run([sys.executable, "-m", "pipeline.task_entrypoint", "--run-settings",
                    "--executor-input", json.dumps(executor_input)], check=True, cwd=ROOT)
    settled = json.loads((tmp_path / "out" / "output.json").read_text())["parameterValues"]
    assert json.loads(settled["Trainer-train_args"]) == {"num_steps": 7}
    metrics = {m["class_name"]: m.get("threshold", {}) for m in json.loads(
        settled["Evaluator-eval_config"])["metrics_specs"][0]["metrics"]}
    assert metrics["BinaryAccuracy"]["value_threshold"]["lower_bound"] == 0.9
    assert metrics["BinaryAccuracy"]["change_threshold"]["absolute"] == -0.05
    assert metrics["AUC"]["value_threshold"]["lower_bound"] == 0.85  # left as compiled
    destination = json.loads(settled["Pusher-push_destination"])
    assert destination["filesystem"]["base_directory"] == "gs://elsewhere/serving"
    assert json.loads(settled["production_model-options_json"])["serving_dir"] == \
        "gs://elsewhere/serving"
    example_gen = json.loads(settled["ShardedExampleGen-options_json"])
    assert example_gen["source"] == str(data) and example_gen["source_fingerprint"]


# Credentials in the compiling machine's environment, each distinctive: none may reach a spec.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "AKIATFRPCOMPILETEST7", "AWS_SECRET_ACCESS_KEY":
               "tfrp/compile+secret-value-never-in-a-spec", "AWS_SESSION_TOKEN":
               "tfrp-session-token-never-in-a-spec", "GOOGLE_APPLICATION_CREDENTIALS":
               "/nonexistent/tfrp-google-key-never-in-a-spec.json"}
MINIO_ROOT = "minio://mlpipeline/v2/artifacts"
GKE_T4 = {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}


@pytest.fixture(scope="module")
def compiled_for_kfp(tmp_path_factory):
    """`--target kfp` to a YAML package on KFP's MinIO, with a GPU Trainer on GKE's T4 nodes,
    compiled as the user's shell would with credentials in its environment; (the file, the
    command's result)."""
    output = tmp_path_factory.mktemp("kfp_package") / "pipeline.yaml"
    with pytest.MonkeyPatch.context() as environment:
        for name, value in CREDENTIALS.items():
            environment.setenv(name, value)
        result = tfrp("compile", "--target", "kfp", "--output", str(output),
                      "--pipeline-root", MINIO_ROOT,
                      "--set", "trainer_accelerator=nvidia.com/gpu:1",
                      "--set", "trainer_node_selector=cloud.google.com/gke-accelerator="
                               "nvidia-tesla-t4",
                      "--set", "trainer_memory=32G", "--set", "transform_cpu=500m",
                      "--set", "evaluator_memory=512Mi", "--set", "task_env=TFRP_STAGE=test",
                      as_user=True)
    assert str(output) in result.stdout
    return output, result


@pytest.fixture(scope="module")
def compiled_for_vertex(tmp_path_factory):
    """`--target vertex` to YAML, a T4 Trainer in a GPU image of the user's, other retries."""
    output = tmp_path_factory.mktemp("vertex_package") / "pipeline.yaml"
    tfrp("compile", "--target", "vertex", "--output", str(output),
         "--pipeline-root", "gs://test-bucket/root",
         "--set", "trainer_accelerator=NVIDIA_TESLA_T4:1", "--set", "trainer_memory=32G",
         "--set", "gpu_image=gcr.io/test-project/tfrp-cuda:7", "--set", "task_retries=5",
         "--set", "task_retry_backoff=90", "--set", "task_env=TFRP_STAGE=test")
    return output


def documents(path) -> list[dict]:
    """A compiled file's documents: the spec, and the platform spec when it has one."""
    text = path.read_text()
    return [json.loads(text)] if path.suffix == ".json" else list(yaml.safe_load_all(text))


def executors_of(path) -> dict:
    return documents(path)[0]["deploymentSpec"]["executors"]


def kfp_compiles(tmp_path, configure) -> dict:
    """The PipelineSpec kfp 2.7's own compiler writes for one task that `configure(task)`
    sets up: the reference for what ours must hold."""
    from kfp import compiler, dsl

    @dsl.container_component
    def reference():
        return dsl.ContainerSpec(image="alpine")

    @dsl.pipeline
    def expected():
        configure(reference())

    path = tmp_path / "reference.yaml"
    compiler.Compiler().compile(expected, str(path))
    return yaml.safe_load(path.read_text())


def kfp_resources(tmp_path, configure) -> dict:
    spec = kfp_compiles(tmp_path, configure)
    return next(iter(spec["deploymentSpec"]["executors"].values()))["container"]["resources"]


@pytest.mark.slow
def test_resources_go_on_the_tasks_containers_as_kfp_writes_them(compiled_for_kfp, tmp_path):
    """Per-component resources land in the executors' container resources exactly as kfp
    2.7's set_memory_limit/set_cpu_limit/set_accelerator_* write them (512Mi and 500m
    included: the numeric fields, in gigabytes and CPUs, which every KFP backend and Vertex
    read; the newer string fields are not in kfp 2.7's PipelineSpec, and its client refuses a
    file that has them); the default image, with no registry host, is warned about in one
    line."""
    output, result = compiled_for_kfp
    warned = [line for line in result.stderr.splitlines() if "registry host" in line]
    assert len(warned) == 1 and "Docker Hub" in warned[0], result.stderr
    executors = executors_of(output)
    assert executors["Trainer_executor"]["container"]["resources"] == kfp_resources(
        tmp_path, lambda task: task.set_accelerator_type("nvidia.com/gpu")
        .set_accelerator_limit(1).set_memory_limit("32G"))
    assert executors["ShardedTransform_executor"]["container"]["resources"] == \
        kfp_resources(tmp_path, lambda task: task.set_cpu_limit("500m")) == {"cpuLimit": 0.5}
    assert executors["Evaluator_executor"]["container"]["resources"] == \
        kfp_resources(tmp_path, lambda task: task.set_memory_limit("512Mi"))
    assert "resources" not in executors["StatisticsGen_executor"]["container"]
    refused = tfrp("compile", "--output", str(tmp_path / "no.yaml"),
                   "--set", "trainer_accelerator=nvidia.com/gpu:two", check=False)
    assert refused.stderr.strip().splitlines()[-1] == (
        "Error: trainer_accelerator is TYPE or TYPE:COUNT (nvidia.com/gpu:1, "
        "NVIDIA_TESLA_T4:1), not 'nvidia.com/gpu:two'")
    assert not (tmp_path / "no.yaml").exists()


@pytest.mark.slow
def test_the_kfp_target_writes_what_open_source_kfp_reads(compiled_for_kfp, tmp_path):
    """For open-source KFP the accelerator is the Kubernetes resource its driver puts in the
    pod's limits, and the node selector goes in the platform spec under the Trainer's
    executor, as kfp-kubernetes' add_node_selector writes it; kfp's loader reads the
    package, platform spec included."""
    from kfp import components

    output, _ = compiled_for_kfp
    accelerator = executors_of(output)["Trainer_executor"]["container"]["resources"][
        "accelerator"]
    assert accelerator == {"type": "nvidia.com/gpu", "count": "1"}
    spec, platform = documents(output)
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert set(executors) == set(spec["deploymentSpec"]["executors"])
    assert executors["Trainer_executor"]["nodeSelector"] == {"labels": GKE_T4}
    assert [label for label, config in executors.items() if "nodeSelector" in config] == \
        ["Trainer_executor"]
    loaded = components.load_component_from_file(str(output))
    assert set(loaded.pipeline_spec.root.dag.tasks) == COMPONENTS | {RUN_SETTINGS}
    assert loaded.pipeline_spec.default_pipeline_root == MINIO_ROOT
    trainer = loaded.platform_spec.platforms["kubernetes"].deployment_spec.executors[
        "Trainer_executor"]
    assert dict(trainer["nodeSelector"]["labels"]) == GKE_T4


@pytest.mark.slow
def test_the_vertex_target_writes_vertex_names_and_no_kubernetes_spec(compiled_for_vertex,
                                                                      tmp_path):
    """For Vertex the accelerator is its own type, as kfp writes it, the file holds the spec
    alone, kfp's loader reads it, and `tfrp submit` builds the job from the YAML."""
    from kfp import components

    (spec,) = documents(compiled_for_vertex)
    assert spec["deploymentSpec"]["executors"]["Trainer_executor"]["container"][
        "resources"] == kfp_resources(
        tmp_path, lambda task: task.set_accelerator_type("NVIDIA_TESLA_T4")
        .set_accelerator_limit(1).set_memory_limit("32G"))
    loaded = components.load_component_from_file(str(compiled_for_vertex))
    assert loaded.name == "tfrp-taxi" and not loaded.platform_spec.platforms
    job = json.loads(tfrp("submit", "--template", str(compiled_for_vertex), "--project",
                          "test-project", "--region", "europe-west4", "--pipeline-root",
                          "gs://test-bucket/run-4", "--dry-run").stdout)
    assert job["pipelineSpec"] == spec


@pytest.mark.slow
def test_each_target_refuses_what_its_backend_cannot_run_in_one_line(compiled_for_kfp,
                                                                     tmp_path):
    """A Vertex accelerator for kfp and a Kubernetes one for Vertex, each with the name to
    use; a Kubernetes platform spec in JSON; a kfp package submitted to Vertex."""
    def refusal(*args):
        output = tmp_path / "refused.yaml"
        result = tfrp("compile", "--output", str(output), *args, check=False)
        assert result.returncode != 0 and not output.exists()
        return result.stderr.strip().splitlines()[-1]

    line = refusal("--target", "kfp", "--set", "trainer_accelerator=NVIDIA_TESLA_T4:1")
    assert line.startswith("Error: trainer_accelerator=NVIDIA_TESLA_T4:1 is a Vertex AI "
                           "accelerator type;"), line
    assert "trainer_accelerator=nvidia.com/gpu:1" in line and \
        "trainer_node_selector=cloud.google.com/gke-accelerator=nvidia-tesla-t4" in line
    line = refusal("--target", "vertex", "--set", "trainer_accelerator=nvidia.com/gpu:1")
    assert line.startswith("Error: trainer_accelerator=nvidia.com/gpu:1 is a Kubernetes "
                           "resource"), line
    assert "trainer_accelerator=NVIDIA_TESLA_T4:1" in line and "NVIDIA_L4" in line
    line = refusal("--target", "vertex", "--set",
                   "trainer_node_selector=cloud.google.com/gke-accelerator=nvidia-tesla-t4")
    assert line.startswith("Error: trainer_node_selector: Vertex AI"), line
    json_output = tmp_path / "pipeline.json"
    result = tfrp("compile", "--output", str(json_output), "--pipeline-root", MINIO_ROOT,
                  check=False)
    assert result.returncode != 0 and not json_output.exists()
    assert result.stderr.strip().splitlines()[-1].endswith(
        f"only a YAML package holds (kfp's client takes .yaml); write {tmp_path}/pipeline.yaml")
    output, _ = compiled_for_kfp
    submitted = tfrp("submit", "--template", str(output), "--project", "p", "--region", "r",
                     "--pipeline-root", "gs://b/r", "--dry-run", check=False)
    assert submitted.stderr.strip().splitlines()[-1] == (
        f"Error: {output} was compiled for open-source Kubeflow Pipelines (its accelerator "
        "nvidia.com/gpu); compile it with --target vertex")


@pytest.mark.slow
def test_the_gpu_image_runs_the_tasks_given_an_accelerator_alone(compiled_for_kfp,
                                                                 compiled_for_vertex):
    """`make image-gpu`'s name, <image>:<tag>-gpu, unless gpu_image names another; every
    task without an accelerator keeps the CPU image."""
    output, _ = compiled_for_kfp
    for path, gpu_image in ((output, f"{DEFAULT_IMAGE}:{DEFAULT_IMAGE_TAG}-gpu"),
                            (compiled_for_vertex, "gcr.io/test-project/tfrp-cuda:7")):
        images = {label: executor["container"]["image"]
                  for label, executor in executors_of(path).items()}
        assert images.pop("Trainer_executor") == gpu_image
        assert set(images.values()) == {f"{DEFAULT_IMAGE}:{DEFAULT_IMAGE_TAG}"}, images


@pytest.mark.slow
def test_every_task_reads_minio_from_env_and_secrets_and_no_credential_is_written(
        compiled_for_kfp, compiled_for_vertex, tmp_path):
    """On KFP's MinIO every task gets its endpoint and the task_env setting's variables in
    its container, and its keys from KFP's own secret by reference, as kfp-kubernetes 1.2's
    use_secret_as_env writes it. The compile ran with credentials in its environment: none
    is anywhere in the file. Vertex's file has the plain variables only."""
    output, _ = compiled_for_kfp
    spec, platform = documents(output)
    secrets = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for label, executor in spec["deploymentSpec"]["executors"].items():
        assert executor["container"]["env"] == [
            {"name": "AWS_ENDPOINT_URL", "value": "http://minio-service.kubeflow:9000"},
            {"name": "TFRP_STAGE", "value": "test"}], label
        assert secrets[label]["secretAsEnv"] == [{
            "secretName": "mlpipeline-minio-artifact",
            "keyToEnv": [{"secretKey": "accesskey", "envVar": "AWS_ACCESS_KEY_ID"},
                         {"secretKey": "secretkey", "envVar": "AWS_SECRET_ACCESS_KEY"}]}]
    text = output.read_text()
    for name, value in CREDENTIALS.items():
        assert value not in text, name
    for executor in executors_of(compiled_for_vertex).values():
        assert executor["container"]["env"] == [{"name": "TFRP_STAGE", "value": "test"}]
    refused = tfrp("compile", "--output", str(tmp_path / "refused.yaml"),
                   "--set", "task_env=AWS_SECRET_ACCESS_KEY=plain", check=False)
    assert refused.stderr.strip().splitlines()[-1].startswith(
        "Error: task_env would write AWS_SECRET_ACCESS_KEY's value into the compiled "
        "pipeline;")


@pytest.mark.slow
def test_the_yaml_package_passes_the_kfp_clients_own_check(compiled_for_kfp):
    """kfp's client reads a package (`create_run_from_pipeline_package`, `upload_pipeline`)
    with `_extract_pipeline_yaml`: the spec and the platform spec under a strict parse, sent
    together to the server."""
    from kfp.client.client import _extract_pipeline_yaml

    output, _ = compiled_for_kfp
    package = _extract_pipeline_yaml(str(output))
    assert package.pipeline_spec.pipeline_info.name == "tfrp-taxi"
    assert set(package.pipeline_spec.root.dag.tasks) == COMPONENTS | {RUN_SETTINGS}
    assert list(package.platform_spec.platforms) == ["kubernetes"]
    sent = package.to_dict()
    assert set(sent) == {"pipeline_spec", "platform_spec"}
    assert sent["platform_spec"] == documents(output)[1]


@pytest.mark.slow
def test_every_task_has_the_retry_policy_kfp_set_retry_writes(compiled, compiled_for_vertex,
                                                              tmp_path):
    """Two retries 30 s apart and doubling by default, as `set_retry(2, "30s")` writes them;
    task_retries and task_retry_backoff set them; 0 retries writes none."""
    from pipeline.kubeflow_runner import set_retry_policy

    for path, retries, backoff in ((compiled, 2, "30s"), (compiled_for_vertex, 5, "90s")):
        expected = kfp_compiles(tmp_path, lambda task: task.set_retry(retries, backoff))
        (policy,) = [task["retryPolicy"] for task in expected["root"]["dag"]["tasks"].values()]
        tasks = documents(path)[0]["root"]["dag"]["tasks"]
        assert set(tasks) == COMPONENTS | {RUN_SETTINGS}
        for name, task in tasks.items():
            assert task["retryPolicy"] == policy, (path, name)
    spec = {"root": {"dag": {"tasks": {"a": {}}}}}
    set_retry_policy(spec, PipelineConfig.create(None, {"task_retries": "0"}))
    assert spec == {"root": {"dag": {"tasks": {"a": {}}}}}


@pytest.mark.slow
def test_submit_without_compiled_pipeline_is_a_clear_error(tmp_path):
    result = tfrp("submit", "--template", str(tmp_path / "missing.json"), "--project", "p",
                  "--region", "r", "--pipeline-root", "gs://b/r", "--dry-run", check=False)
    assert result.returncode != 0
    assert "run `tfrp compile` first" in result.stderr


# -- The image pipeline --------------------------------------------------------------------------
def raw_example(**features: bytes) -> bytes:
    """One serialized raw tf.Example of bytes features, as a serving request carries it."""
    return tf.train.Example(features=tf.train.Features(feature={
        name: tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
        for name, value in features.items()})).SerializeToString()


@pytest.fixture(scope="module")
def image_runs(tmp_path_factory):
    """The digits pipeline (encoded images through Transform) and a folder of JPEGs given by
    path (stored by Transform as raw pixels), run at the same time."""
    digits_root = tmp_path_factory.mktemp("digits_runs")
    folder = photo_folder(tmp_path_factory)
    photo_root = tmp_path_factory.mktemp("photo_runs")
    digits, photos = tfrp_concurrently(
        ("run", "--dataset", "digits", "--output-root", str(digits_root),
         "--train-steps", "200", "--set", "batch_size=64"),
        ("run", "--dataset", "images", "--data-root", str(folder),
         "--output-root", str(photo_root), "--train-steps", "150",
         "--set", "image_shape=[16,16,3]", "--set", "num_classes=10",
         "--set", "image_storage=raw",
         "--set", "batch_size=32", "--set", "min_accuracy=0.5"))
    return (digits_root, digits.stdout), (folder, photos.stdout, photo_root)


@pytest.fixture(scope="module")
def digits_run(image_runs):
    return image_runs[0]


@pytest.mark.pipeline
def test_digits_pipeline_trains_blesses_and_pushes(digits_run):
    output_root, stdout = digits_run
    for component in COMPONENTS:
        assert re.search(rf"^\s+{component}\s+ran\b", stdout, re.M), stdout
    assert "Model blessed by Evaluator: yes" in stdout
    pushed = re.search(r"^Pushed model: (\S+)$", stdout, re.M).group(1)
    assert pushed.startswith(str(output_root))


@pytest.mark.pipeline
def test_pushed_digits_model_classifies_raw_png_examples(digits_run):
    """The serving signature takes one raw Example per image (just the PNG bytes), applies
    the transform graph, decodes, and classifies."""
    output_root, stdout = digits_run
    pushed = re.search(r"^Pushed model: (\S+)$", stdout, re.M).group(1)
    folder = output_root / "datasets" / "digits"
    with open(folder / "labels.csv") as f:
        rows = list(csv.DictReader(f))[-200:]
    examples = [raw_example(image=(folder / row["filename"]).read_bytes()) for row in rows]
    model = tf.saved_model.load(pushed)
    probabilities = model.signatures["serving_default"](
        examples=tf.constant(examples))["probabilities"].numpy()
    assert probabilities.shape == (200, 10)
    predicted = probabilities.argmax(axis=1)
    accuracy = (predicted == [int(r["label"]) for r in rows]).mean()
    assert accuracy > 0.8, accuracy


DIGIT_NAMES = "zero one two three four five six seven eight nine".split()


def photo_folder(tmp_path_factory):
    """A folder given by path: 24x24 colour JPEGs named by word labels, trained at 16x16."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    folder = tmp_path_factory.mktemp("photos")
    (folder / "img").mkdir()
    digits = load_digits()
    with open(folder / "labels.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["filename", "label"])
        for i in range(600):
            pixels = np.round(digits.images[i] * (255 / 16)).astype(np.uint8)
            colour = np.stack([pixels, pixels // 2, 255 - pixels], axis=-1)
            Image.fromarray(colour).resize((24, 24)).save(folder / "img" / f"{i}.jpg")
            writer.writerow([f"img/{i}.jpg", DIGIT_NAMES[digits.target[i]]])
    return folder


@pytest.fixture(scope="module")
def photo_folder_run(image_runs):
    return image_runs[1]


@pytest.mark.pipeline
def test_image_folder_by_path_trains_and_serves_resized_jpegs(photo_folder_run):
    """String labels become vocabulary ids in Transform, and the images 16x16 raw pixels
    (image_storage=raw); the served model takes raw JPEGs at their own size (24x24), and its
    transform graph resizes them to the trained 16x16 before it classifies them."""
    from tfrecord_shards.codec import schema_file
    from shard_readers.images import raw_shape

    folder, stdout, output_root = photo_folder_run
    assert "Reused from cache: 0 of 9" in stdout and "Model blessed by Evaluator: yes" in stdout
    [stored] = glob.glob(str(output_root / "**" / "ShardedTransform" / "transformed_examples"
                              / "*" / "schema.pbtxt"), recursive=True)
    [post] = glob.glob(str(output_root / "**" / "ShardedTransform" / "post_transform_schema"
                            / "*" / "schema.pbtxt"), recursive=True)
    for path in (stored, post):
        image = next(f for f in schema_file.load_schema(path).feature if f.name == "image")
        assert raw_shape(image) == (16, 16, 3), path
    pushed = re.search(r"^Pushed model: (\S+)$", stdout, re.M).group(1)
    with open(folder / "labels.csv") as f:
        rows = list(csv.DictReader(f))[-150:]
    examples = tf.constant([raw_example(image=(folder / row["filename"]).read_bytes(),
                                        label=row["label"].encode()) for row in rows])
    model = tf.saved_model.load(pushed)
    probabilities = model.signatures["serving_default"](examples=examples)["probabilities"]
    label_ids = model.signatures["transform_features"](examples=examples)["label"]
    assert probabilities.shape == (150, 10)
    assert sorted(set(label_ids.numpy().ravel().tolist())) == list(range(10))
    accuracy = (probabilities.numpy().argmax(axis=1) == label_ids.numpy().ravel()).mean()
    assert accuracy > 0.6, accuracy


@pytest.mark.pipeline
def test_real_photos_with_damaged_files_train_to_a_pushed_model(tmp_path):
    """scikit-learn's two photos, cropped into a two-class folder, with a truncated JPEG, an
    empty file, a text file and a TIFF among them (conftest.real_photo_folder). ExampleGen
    quarantines the four and the run summary counts them; the rest train, within the epoch
    budget (not train_steps' 1,000 steps over 60 images), to a blessed, pushed model that
    tells the photos apart."""
    from conftest import DAMAGED_PHOTOS, real_photo_folder
    from pipeline import run_summary

    folder = tmp_path / "photos"
    rows = real_photo_folder(folder, crops=40, size=64)
    result = tfrp("run", "--dataset", "images", "--data-root", str(folder),
                  "--output-root", str(tmp_path / "runs"), "--pipeline-name", "photos",
                  "--set", "image_shape=[32,32,3]", "--set", "num_classes=2",
                  "--set", "on_bad_record=quarantine", "--set", "min_accuracy=0.8")
    assert f"Rows left out: {len(DAMAGED_PHOTOS)} quarantined" in result.stdout
    summary = run_summary.summarize(str(tmp_path / "runs" / "metadata" / "photos"
                                        / "metadata.db"), "photos")
    assert sum(summary.rows_per_split.values()) == len(rows)
    assert summary.rows_left_out["quarantined"] == len(DAMAGED_PHOTOS)
    assert summary.blessed and summary.pushed_model
    assert summary.evaluation["accuracy"] >= 0.8
    (model_run,) = summary.artifacts["ModelRun"]
    with open(os.path.join(model_run.uri, "input_report.json")) as f:
        report = json.load(f)
    assert sum(epoch["steps"] for epoch in report["epochs"]) < 1000

    model = tf.saved_model.load(summary.pushed_model)
    examples = tf.constant([raw_example(image=(folder / name).read_bytes())
                            for name, _ in rows])
    served = model.signatures["serving_default"](examples=examples)
    predicted = [c.decode() for c in served["classes"].numpy().ravel()]
    accuracy = sum(p == label for p, (_, label) in zip(predicted, rows)) / len(rows)
    assert accuracy >= 0.8, accuracy


# -- Settings ------------------------------------------------------------------------------------
def test_yaml_then_set_then_named_options_override_defaults(tmp_path):
    settings = tmp_path / "settings.yaml"
    settings.write_text("train_steps: 50\npacked_rows: 0\nbeam_args: [--direct_num_workers=2]\n")
    config = PipelineConfig.create(str(settings), {"packed_rows": "256", "min_auc": "none",
                                                   "enable_cache": "false"})
    assert (config.train_steps, config.packed_rows, config.min_auc, config.enable_cache) == (
        50, 256, None, False)
    assert config.beam_pipeline_args == ["--runner=DirectRunner", "--direct_num_workers=2",
                                         f"--sdk_container_image={DEFAULT_IMAGE}:{DEFAULT_IMAGE_TAG}"]
    own_image = PipelineConfig.create(None, {"beam_args": "[--sdk_container_image=mine:1]"})
    assert own_image.beam_pipeline_args == ["--runner=DirectRunner",
                                            "--sdk_container_image=mine:1"]
    assert config.label_key == "big_tipper" and config.schema == "import"
    digits = PipelineConfig.create(None, {"dataset": "digits"})
    assert (digits.pipeline_name, digits.image_shape, digits.schema_file) == (
        "tfrp-digits", [8, 8, 1], os.path.join(ROOT, "schemas", "digits", "schema.pbtxt"))
    # train_steps is the dataset's own unless set: a table's model trains longer.
    table = {"dataset": "table", "data_root": str(tmp_path), "label_key": "y"}
    assert (digits.train_steps, PipelineConfig.create(None, table).train_steps,
            PipelineConfig.create(str(settings), table).train_steps) == (1000, 10_000, 50)


def test_bad_settings_are_named(tmp_path):
    with pytest.raises(KeyError, match="unknown setting 'trian_steps'"):
        PipelineConfig.create(None, {"trian_steps": "5"})
    with pytest.raises(ValueError, match="train_steps: expected a number"):
        PipelineConfig.create(None, {"train_steps": "many"})
    with pytest.raises(ValueError, match="DataflowRunner needs dataflow_project"):
        PipelineConfig(beam_runner="DataflowRunner")
    with pytest.raises(ValueError, match="dataset images needs data_root"):
        PipelineConfig(dataset="images")
    result = tfrp("run", "--set", "trian_steps=5", check=False)
    assert result.returncode == 2 and "unknown setting 'trian_steps'" in result.stderr


def test_edited_source_changes_example_gen_parameters(tmp_path):
    """An edited source must not be served from the cache."""
    from components.example_gen.component import ShardedExampleGen

    source = tmp_path / "data.csv"
    source.write_text("a,b\n1,2\n")
    before = ShardedExampleGen(source=str(source)).exec_properties
    source.write_text("a,b\n1,2\n3,4\n")
    after = ShardedExampleGen(source=str(source)).exec_properties
    assert before != after


def test_image_and_container_paths_match_makefile_and_dockerfile():
    with open(os.path.join(ROOT, "Makefile")) as f:
        makefile = f.read()
    assert re.search(rf"^IMAGE \?= {re.escape(DEFAULT_IMAGE)}$", makefile, re.M)
    assert re.search(rf"^IMAGE_TAG \?= {re.escape(DEFAULT_IMAGE_TAG)}$", makefile, re.M)
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        dockerfile = f.read()
    assert re.search(rf"^WORKDIR {CONTAINER_WORKDIR}$", dockerfile, re.M)
    assert re.search(r"^COPY schemas ", dockerfile, re.M)
    # ExampleGen's Spark engine runs a JVM inside the image.
    assert re.search(r"apt-get install [^&]*openjdk-17-jre-headless", dockerfile)


def test_the_stock_evaluator_is_one_setting_away(tmp_path):
    """evaluator=stock puts TFX's own Evaluator (TFMA on Beam) where ours runs by default;
    both take the same inputs and write the same artifacts."""
    from components.evaluator.component import Evaluator, StockEvaluator
    from pipeline.pipeline import create_pipeline

    for choice, expected in (("fast", Evaluator), ("stock", StockEvaluator)):
        config = PipelineConfig.create(None, {"evaluator": choice,
                                              "output_root": str(tmp_path)})
        (evaluator,) = [c for c in create_pipeline(config).components if c.id == "Evaluator"]
        assert type(evaluator) is expected
        assert set(evaluator.outputs) == {"evaluation", "blessing"}
    with pytest.raises(Exception, match="evaluator must be fast or stock"):
        PipelineConfig.create(None, {"evaluator": "tfma"})


def test_ours_gets_transforms_split_only_when_it_holds_the_same_rows(tmp_path):
    """One span: our Evaluator is given Transform's output of the examples it evaluates.
    A window of spans (Transform reads more spans than the Evaluator) or stock's Evaluator:
    it is not."""
    from pipeline.pipeline import create_pipeline

    for settings, given in (({}, True), ({"spans": 3}, False), ({"evaluator": "stock"}, False)):
        config = PipelineConfig.create(None, {**settings, "output_root": str(tmp_path)})
        components = {c.id: c for c in create_pipeline(config).components}
        inputs = components["Evaluator"].inputs
        assert ("transformed_examples" in inputs) is given, settings
        if given:
            assert inputs["transformed_examples"].producer_component_id == "ShardedTransform"
            assert inputs["examples"].producer_component_id == "ShardedExampleGen"


def deployment_commands(program: str) -> list[list[str]]:
    """The `program` commands of docs/DEPLOYMENT.md's shell blocks, as a shell splits them
    (continued lines joined)."""
    import shlex

    with open(os.path.join(ROOT, "docs", "DEPLOYMENT.md"), encoding="utf-8") as f:
        blocks = re.findall(r"```sh\n(.*?)```", f.read(), re.S)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [shlex.split(line, comments=True)[1:] for line in lines
            if line.startswith(program + " ")]


@pytest.mark.slow
def test_the_deployment_guides_compile_and_submit_commands_run_as_written(tmp_path):
    """Each `tfrp compile` and `tfrp submit` of docs/DEPLOYMENT.md, as written, with its
    output in a temporary folder and `--dry-run` (no network, no credentials): each compiles,
    kfp's client takes each kfp package (`_extract_pipeline_yaml`, the first thing
    `create_run_from_pipeline_package` and `upload_pipeline` do), and each submit builds
    its job."""
    from kfp.client.client import _extract_pipeline_yaml

    commands = deployment_commands("tfrp")
    compiles = [c for c in commands if c[0] == "compile"]
    submits = [c for c in commands if c[0] == "submit"]
    assert len(compiles) >= 2 and len(submits) >= 2, commands
    for n, command in enumerate(compiles):
        output = str(tmp_path / f"{n}" / "pipeline.yaml")
        at = command.index("--output") + 1
        tfrp(*command[:at], output, *command[at + 1:])
        target = command[command.index("--target") + 1]
        if target == "kfp":
            assert _extract_pipeline_yaml(output).pipeline_spec.pipeline_info.name
    for command in submits:
        at = command.index("--template") + 1
        result = tfrp(*command[:at], str(tmp_path / "0" / "pipeline.yaml"),
                      *command[at + 1:], "--dry-run")
        json.loads(result.stdout)  # the job, as it would be sent
        given = [command[i + 1] for i, flag in enumerate(command) if flag == "--param"]
        for value in (param.split("=", 1)[1] for param in given):
            assert value in result.stdout, (value, result.stdout[-2000:])
