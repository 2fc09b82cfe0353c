"""What each heavy task of a compiled pipeline asks its cluster for: CPUs, memory and an
accelerator, written into the spec's container resources (`cpuLimit`, `memoryLimit`,
`accelerator.type`/`count`), which Vertex AI reads to pick the machine and open-source
Kubeflow Pipelines turns into the pod's limits; and, on open-source Kubeflow Pipelines, the
nodes it may run on (a node selector). Unset: the backend's default pod.

Set with `--set trainer_accelerator=nvidia.com/gpu:1` (a type, and a count after the colon,
1 if left out), `--set transform_cpu=8` (a number, or millicores as 500m), `--set
trainer_memory=32G` (Kubernetes' units: K, M, G, T, Ki, Mi, Gi, Ti) and `--set
trainer_node_selector=cloud.google.com/gke-accelerator=nvidia-tesla-t4` (LABEL=VALUE, commas
between several), for trainer, transform, evaluator, statistics_gen and example_gen
(accelerators and node selectors for the first three). The numbers are written as kfp 2.7's
`set_cpu_limit`, `set_memory_limit` and `set_accelerator_type`/`set_accelerator_limit` write
them. An accelerator is named as its backend names it (`check_accelerators`): a Kubernetes
resource (nvidia.com/gpu) for open-source Kubeflow Pipelines, whose driver makes the type the
name of the pod's resource limit, and one of Vertex AI's accelerator types (NVIDIA_TESLA_T4)
for Vertex.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Optional

from tfrecord_shards.options import JsonOptions, SettingError, setting
from pipeline.kubernetes_platform import key_values

# A setting's prefix -> the compiled task it is for.
TASKS = {"trainer": "Trainer", "transform": "ShardedTransform", "evaluator": "Evaluator",
         "statistics_gen": "StatisticsGen", "example_gen": "ShardedExampleGen"}
# A setting's kind, by the end of its name.
KINDS = ("cpu", "memory", "accelerator", "node_selector")
_CPU = re.compile(r"^([0-9]*[.])?[0-9]+m?$")
_MEMORY = re.compile(r"^([0-9]+)(E|Ei|P|Pi|T|Ti|G|Gi|M|Mi|K|Ki)?$")
# Bytes per unit, as kfp counts them (kfp/dsl/constants.py); kfp writes gigabytes (10^9).
_UNITS = {"E": 10 ** 18, "Ei": 2 ** 60, "P": 10 ** 15, "Pi": 2 ** 50, "T": 10 ** 12,
          "Ti": 2 ** 40, "G": 10 ** 9, "Gi": 2 ** 30, "M": 10 ** 6, "Mi": 2 ** 20,
          "K": 10 ** 3, "Ki": 2 ** 10}
# A Kubernetes extended resource: a domain, a slash and a name (nvidia.com/gpu).
_KUBERNETES_RESOURCE = re.compile(
    r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
# A node label: its key (a domain and a slash, or none, then a name) and its value.
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
# GKE's node label naming a node's GPU (its value: Vertex's type in lower case, with hyphens).
GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"


def _resource(kind: str, task: str) -> Any:
    """A resource setting of `task`: unset by default, set with --set or YAML."""
    help_text = {
        "cpu": f"CPUs for the {task} task on Kubeflow or Vertex (8, or 500m).",
        "memory": f"Memory for the {task} task on Kubeflow or Vertex (32G, 512Mi).",
        "accelerator": f"An accelerator for the {task} task, TYPE:COUNT: nvidia.com/gpu:1 "
                       f"on Kubeflow, NVIDIA_TESLA_T4:1 on Vertex.",
        "node_selector": f"Node labels the {task} task's node must have on Kubeflow, "
                         f"LABEL=VALUE (cloud.google.com/gke-accelerator=nvidia-tesla-t4)."}[kind]
    return setting(None, help_text, flag=False)


@dataclasses.dataclass(frozen=True)
class TaskResources(JsonOptions):
    trainer_cpu: Optional[str] = _resource("cpu", "Trainer")
    trainer_memory: Optional[str] = _resource("memory", "Trainer")
    trainer_accelerator: Optional[str] = _resource("accelerator", "Trainer")
    trainer_node_selector: Optional[dict] = _resource("node_selector", "Trainer")
    transform_cpu: Optional[str] = _resource("cpu", "Transform")
    transform_memory: Optional[str] = _resource("memory", "Transform")
    transform_accelerator: Optional[str] = _resource("accelerator", "Transform")
    transform_node_selector: Optional[dict] = _resource("node_selector", "Transform")
    evaluator_cpu: Optional[str] = _resource("cpu", "Evaluator")
    evaluator_memory: Optional[str] = _resource("memory", "Evaluator")
    evaluator_accelerator: Optional[str] = _resource("accelerator", "Evaluator")
    evaluator_node_selector: Optional[dict] = _resource("node_selector", "Evaluator")
    statistics_gen_cpu: Optional[str] = _resource("cpu", "StatisticsGen")
    statistics_gen_memory: Optional[str] = _resource("memory", "StatisticsGen")
    example_gen_cpu: Optional[str] = _resource("cpu", "ExampleGen")
    example_gen_memory: Optional[str] = _resource("memory", "ExampleGen")

    def __post_init__(self) -> None:
        super().__post_init__()
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None:
                continue
            if _kind(field.name) == "node_selector":
                # --set gives LABEL=VALUE text, YAML a mapping: kept as the mapping.
                object.__setattr__(self, field.name, _node_selector(field.name, value))
            else:
                _parse(field.name, str(value))  # a wrong value is refused when set

    def for_task(self, task: str) -> dict:
        """The container resources of compiled task `task` (the spec's JSON), {} for none."""
        resources = {}
        for kind in ("cpu", "memory", "accelerator"):
            value = self._setting(task, kind)
            if value is not None:
                resources.update(_parse(f"{_prefix(task)}_{kind}", str(value)))
        return resources

    def node_selector(self, task: str) -> dict[str, str]:
        """The node labels compiled task `task` must run on, {} for any node."""
        return dict(self._setting(task, "node_selector") or {})

    def _setting(self, task: str, kind: str) -> Any:
        return getattr(self, f"{_prefix(task)}_{kind}", None) if _prefix(task) else None


def _prefix(task: str) -> Optional[str]:
    return next((prefix for prefix, name in TASKS.items() if name == task), None)


def _kind(name: str) -> str:
    return next(kind for kind in KINDS if name.endswith(f"_{kind}"))


def _parse(name: str, value: str) -> dict:
    kind = _kind(name)
    if kind == "cpu":
        if not _CPU.match(value):
            raise SettingError([name], f"{{0}} is a number of CPUs (8, 0.5) or millicores "
                                       f"(500m), not {value!r}")
        return {"cpuLimit": float(value[:-1]) / 1000 if value.endswith("m") else float(value)}
    if kind == "memory":
        found = _MEMORY.match(value)
        if not found:
            raise SettingError([name], f"{{0}} is a size in Kubernetes' units (32G, 512Mi), "
                                       f"not {value!r}")
        number, unit = found.groups()
        # kfp's own arithmetic (PipelineTask._validate_memory_request_limit), so that the
        # float is the one it writes to the last bit.
        gigabytes = float(number) if unit == "G" else \
            float(number) * _UNITS[unit] / _UNITS["G"] if unit else float(number) / _UNITS["G"]
        return {"memoryLimit": gigabytes}
    accelerator, _, count = value.partition(":")
    if not accelerator or (count and not count.isdigit()) or count == "0":
        raise SettingError([name], f"{{0}} is TYPE or TYPE:COUNT (nvidia.com/gpu:1, "
                                   f"NVIDIA_TESLA_T4:1), not {value!r}")
    return {"accelerator": {"type": accelerator, "count": str(int(count or 1))}}


def _node_selector(name: str, value: Any) -> dict[str, str]:
    labels = key_values(name, value, "LABEL=VALUE")
    for key, label in labels.items():
        if not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(label):
            raise SettingError([name], f"{{0}} holds node labels LABEL=VALUE "
                                       f"({GKE_ACCELERATOR_LABEL}=nvidia-tesla-t4), not "
                                       f"{key}={label}")
    return labels


def check_accelerators(resources: TaskResources, vertex: bool) -> None:
    """Each accelerator named as its backend names it, else a SettingError in one line that
    names the right one. Open-source Kubeflow Pipelines' driver makes the type the name of
    the pod's resource limit (initPodSpecPatch), so it takes a Kubernetes resource
    (nvidia.com/gpu); Vertex AI takes one of its accelerator types (NVIDIA_TESLA_T4)."""
    for field in dataclasses.fields(resources):
        value = getattr(resources, field.name)
        if value is None or _kind(field.name) != "accelerator":
            continue
        accelerator, _, count = str(value).partition(":")
        count = count or "1"
        if vertex:
            known = vertex_accelerators()
            if accelerator not in known:
                what = "a Kubernetes resource, which open-source Kubeflow Pipelines takes" \
                    if "/" in accelerator else "not one of Vertex AI's accelerator types"
                raise SettingError([field.name], (
                    f"{{0}}={value} is {what}; Vertex AI takes its own, such as "
                    f"{{0}}=NVIDIA_TESLA_T4:{count} (" + ", ".join(known) + "), or compile "
                    "with --target kfp"))
        elif not _KUBERNETES_RESOURCE.match(accelerator):
            selector = field.name.replace("_accelerator", "_node_selector")
            if accelerator.startswith("NVIDIA_"):
                label = accelerator.lower().replace("_", "-")
                suggestion = (f"set {{0}}=nvidia.com/gpu:{count} and (on GKE) {selector}="
                              f"{GKE_ACCELERATOR_LABEL}={label}")
            else:
                suggestion = f"such as {{0}}=nvidia.com/gpu:{count} or google.com/tpu:{count}"
            what = "a Vertex AI accelerator type" if re.match(r"^[A-Z0-9_]+$", accelerator) \
                else "not a Kubernetes resource name"
            raise SettingError([field.name], (
                f"{{0}}={value} is {what}; open-source Kubeflow Pipelines takes the "
                f"Kubernetes resource: {suggestion}, or compile with --target vertex"))


def vertex_accelerators() -> list[str]:
    """Vertex AI's accelerator types, as the installed aiplatform client lists them."""
    # aiplatform: 1.3 s to import; only Vertex's accelerators need it, not a local run.
    from google.cloud.aiplatform_v1.types.accelerator_type import AcceleratorType

    return [kind.name for kind in AcceleratorType if kind.value]


def apply(spec: dict, resources: TaskResources) -> None:
    """Writes each task's resources into its executor's container in `spec`."""
    tasks = spec["root"]["dag"]["tasks"]
    executors = spec["deploymentSpec"]["executors"]
    for task_name, task in tasks.items():
        wanted = resources.for_task(task_name)
        if wanted:
            label = spec["components"][task["componentRef"]["name"]]["executorLabel"]
            executors[label]["container"]["resources"] = wanted
