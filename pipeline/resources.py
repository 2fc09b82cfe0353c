"""What each heavy task of a compiled pipeline asks its cluster for: CPUs, memory and an
accelerator, written into the spec's container resources (`cpuLimit`, `memoryLimit`,
`accelerator.type`/`count`), which Vertex AI reads to pick the machine and open-source
Kubeflow Pipelines turns into the pod's limits. Unset: the backend's default pod.

Set with `--set trainer_accelerator=NVIDIA_TESLA_T4:1` (a type, and a count after the colon,
1 if left out), `--set transform_cpu=8` (a number, or millicores as 500m) and `--set
trainer_memory=32G` (Kubernetes' units: K, M, G, T, Ki, Mi, Gi, Ti), for trainer, transform,
evaluator, statistics_gen and example_gen. The numbers are read as kfp's `set_cpu_limit`,
`set_memory_limit` and `set_accelerator_limit` read them.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Optional

from components.options import JsonOptions, SettingError, setting

# A setting's prefix -> the compiled task it is for.
TASKS = {"trainer": "Trainer", "transform": "ShardedTransform", "evaluator": "Evaluator",
         "statistics_gen": "StatisticsGen", "example_gen": "ShardedExampleGen"}
_CPU = re.compile(r"^([0-9]*[.])?[0-9]+m?$")
_MEMORY = re.compile(r"^([0-9]+)(E|Ei|P|Pi|T|Ti|G|Gi|M|Mi|K|Ki)?$")
# Bytes per unit; kfp writes memory in gigabytes (10^9 bytes).
_UNITS = {"E": 10 ** 18, "Ei": 2 ** 60, "P": 10 ** 15, "Pi": 2 ** 50, "T": 10 ** 12,
          "Ti": 2 ** 40, "G": 10 ** 9, "Gi": 2 ** 30, "M": 10 ** 6, "Mi": 2 ** 20,
          "K": 10 ** 3, "Ki": 2 ** 10, None: 1}


def _resource(kind: str, task: str) -> Optional[str]:
    """A resource setting of `task`: unset by default, set with --set or YAML."""
    help_text = {
        "cpu": f"CPUs for the {task} task on Kubeflow or Vertex (8, or 500m).",
        "memory": f"Memory for the {task} task on Kubeflow or Vertex (32G, 512Mi).",
        "accelerator": f"An accelerator for the {task} task on Kubeflow or Vertex, TYPE:COUNT "
                       f"(NVIDIA_TESLA_T4:1)."}[kind]
    return setting(None, help_text, flag=False)


@dataclasses.dataclass(frozen=True)
class TaskResources(JsonOptions):
    trainer_cpu: Optional[str] = _resource("cpu", "Trainer")
    trainer_memory: Optional[str] = _resource("memory", "Trainer")
    trainer_accelerator: Optional[str] = _resource("accelerator", "Trainer")
    transform_cpu: Optional[str] = _resource("cpu", "Transform")
    transform_memory: Optional[str] = _resource("memory", "Transform")
    transform_accelerator: Optional[str] = _resource("accelerator", "Transform")
    evaluator_cpu: Optional[str] = _resource("cpu", "Evaluator")
    evaluator_memory: Optional[str] = _resource("memory", "Evaluator")
    evaluator_accelerator: Optional[str] = _resource("accelerator", "Evaluator")
    statistics_gen_cpu: Optional[str] = _resource("cpu", "StatisticsGen")
    statistics_gen_memory: Optional[str] = _resource("memory", "StatisticsGen")
    example_gen_cpu: Optional[str] = _resource("cpu", "ExampleGen")
    example_gen_memory: Optional[str] = _resource("memory", "ExampleGen")

    def __post_init__(self) -> None:
        super().__post_init__()
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None:
                _parse(field.name, str(value))  # a wrong value is refused when set

    def for_task(self, task: str) -> dict:
        """The container resources of compiled task `task` (the spec's JSON), {} for none."""
        resources = {}
        for prefix, name in TASKS.items():
            if name != task:
                continue
            for kind in ("cpu", "memory", "accelerator"):
                value = getattr(self, f"{prefix}_{kind}", None)
                if value is not None:
                    resources.update(_parse(f"{prefix}_{kind}", str(value)))
        return resources


def _parse(name: str, value: str) -> dict:
    kind = name.rsplit("_", 1)[1]
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
        return {"memoryLimit": int(found.group(1)) * _UNITS[found.group(2)] / 10 ** 9}
    accelerator, _, count = value.partition(":")
    if not accelerator or (count and not count.isdigit()) or count == "0":
        raise SettingError([name], f"{{0}} is TYPE or TYPE:COUNT (NVIDIA_TESLA_T4:1), "
                                   f"not {value!r}")
    return {"accelerator": {"type": accelerator, "count": str(int(count or 1))}}


def apply(spec: dict, resources: TaskResources) -> None:
    """Writes each task's resources into its executor's container in `spec`."""
    tasks = spec["root"]["dag"]["tasks"]
    executors = spec["deploymentSpec"]["executors"]
    for task_name, task in tasks.items():
        wanted = resources.for_task(task_name)
        if wanted:
            label = spec["components"][task["componentRef"]["name"]]["executorLabel"]
            executors[label]["container"]["resources"] = wanted
