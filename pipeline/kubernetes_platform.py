"""What a compiled pipeline's task pods get besides their container: environment variables
(the container's `env`, which Vertex AI sets as well), and, for open-source Kubeflow
Pipelines, environment variables from Kubernetes secrets and node selectors, in the
`platforms.kubernetes` document that follows the PipelineSpec in a YAML package, keyed by
executor label, as kfp-kubernetes writes it.

Set with `task_env` (NAME=VALUE) and `task_secret_env` (NAME=SECRET:KEY, a secret's name and
one of its keys). A spec names a secret and never holds its value; a credential variable
given as a plain value is refused, since it would be written into the spec in the clear.

On a `minio://` pipeline root (open-source Kubeflow Pipelines' default store, which our tasks
read through the s3 layer) both start from what KFP's own MinIO needs: its service's endpoint
and its keys from KFP's `mlpipeline-minio-artifact` secret. The setting's entries add to them
or replace them by name, and an empty value leaves a variable out.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Optional

import yaml

from tfrecord_shards.options import JsonOptions, SettingError, setting

# The backends a pipeline compiles for, by the names `tfrp compile --target` takes (kubeflow:
# kfp's name from before the two backends' files differed).
KFP, VERTEX = "kfp", "vertex"
TARGETS = {"kfp": KFP, "kubeflow": KFP, "vertex": VERTEX}
DEFAULT_TARGET = KFP
MINIO_SCHEME = "minio://"
# KFP's MinIO: the service in the kubeflow namespace, and the secret with its keys, which
# KFP installs in the kubeflow namespace and its profile controller copies to each user's.
MINIO_ENV = {"AWS_ENDPOINT_URL": "http://minio-service.kubeflow:9000"}
MINIO_SECRET_ENV = {"AWS_ACCESS_KEY_ID": "mlpipeline-minio-artifact:accesskey",
                    "AWS_SECRET_ACCESS_KEY": "mlpipeline-minio-artifact:secretkey"}
# Variables whose value is a credential: a spec holds them only as a secret's reference.
CREDENTIAL_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A secret's name (a DNS subdomain), a colon, and one of its keys.
_SECRET_REFERENCE = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?):([-._A-Za-z0-9]+)$")


@dataclasses.dataclass(frozen=True)
class TaskEnvironment(JsonOptions):
    task_env: Optional[dict] = setting(
        None, "Environment variables of every compiled task, NAME=VALUE (default on a "
        "minio:// pipeline root: KFP's MinIO endpoint as AWS_ENDPOINT_URL).", flag=False)
    task_secret_env: Optional[dict] = setting(
        None, "Environment variables of every compiled task from Kubernetes secrets, "
        "NAME=SECRET:KEY (default on a minio:// pipeline root: the AWS keys from "
        "mlpipeline-minio-artifact).", flag=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.task_env is not None:
            env = key_values("task_env", self.task_env, "NAME=VALUE")
            for name, value in env.items():
                _check_name("task_env", name)
                if name in CREDENTIAL_VARIABLES and value:
                    raise SettingError(["task_env"], (
                        f"{{0}} would write {name}'s value into the compiled pipeline; name "
                        f"the Kubernetes secret that holds it instead: task_secret_env="
                        f"{name}=SECRET:KEY"))
            object.__setattr__(self, "task_env", env)
        if self.task_secret_env is not None:
            references = key_values("task_secret_env", self.task_secret_env, "NAME=SECRET:KEY")
            for name, reference in references.items():
                _check_name("task_secret_env", name)
                if reference and not _SECRET_REFERENCE.match(reference):
                    # The value is not echoed: it may be the secret itself.
                    raise SettingError(["task_secret_env"], (
                        f"{{0}} gives {name} as SECRET:KEY, a Kubernetes secret's name and "
                        f"one of its keys (AWS_ACCESS_KEY_ID=mlpipeline-minio-artifact:"
                        f"accesskey), never the value"))
            object.__setattr__(self, "task_secret_env", references)


def key_values(name: str, value: Any, form: str) -> dict[str, str]:
    """Mapping setting `name` as strings: YAML gives a mapping, `--set` the text
    KEY=VALUE,KEY=VALUE (or a YAML mapping, `{KEY: VALUE}`)."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):
            value = yaml.safe_load(text)
        else:
            pairs = [item.partition("=") for item in text.split(",") if item.strip()]
            if any(not sep or not key.strip() for key, sep, _ in pairs):
                raise SettingError([name], f"{{0}} takes {form}, commas between several")
            value = {key.strip(): item.strip() for key, _, item in pairs}
    if not isinstance(value, dict):
        raise SettingError([name], f"{{0}} takes {form}, commas between several")
    return {str(key): _text(item) for key, item in value.items()}


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _check_name(setting_name: str, name: str) -> None:
    if not _ENV_NAME.match(name):
        raise SettingError([setting_name], f"{{0}}: {name!r} is not an environment variable's "
                                           f"name (letters, digits and _)")


def on_minio(*paths: Optional[str]) -> bool:
    """Whether any of the paths is on KFP's MinIO."""
    return any(path and path.startswith(MINIO_SCHEME) for path in paths)


def task_env(environment: TaskEnvironment, minio: bool) -> dict[str, str]:
    """Every task's plain environment, by name: MinIO's endpoint when `minio`, then the
    task_env setting's; an empty value leaves a variable out."""
    env = {**(MINIO_ENV if minio else {}), **(environment.task_env or {})}
    return {name: value for name, value in sorted(env.items()) if value}


def task_secret_env(environment: TaskEnvironment, minio: bool) -> dict[str, tuple[str, str]]:
    """{variable: (secret, key)} for every task: MinIO's keys when `minio`, then the
    task_secret_env setting's; an empty reference leaves a variable out."""
    references = {**(MINIO_SECRET_ENV if minio else {}), **(environment.task_secret_env or {})}
    return {name: tuple(reference.split(":", 1))
            for name, reference in sorted(references.items()) if reference}


def set_env(spec: dict, env: Mapping[str, str]) -> None:
    """Puts `env` in every executor container's `env` (kfp's `set_env_variable` field)."""
    if not env:
        return
    for executor in spec["deploymentSpec"]["executors"].values():
        container = executor["container"]
        given = {item["name"]: item["value"] for item in container.get("env", [])}
        container["env"] = [{"name": name, "value": value}
                            for name, value in {**given, **env}.items()]


def executor_config(secret_env: Mapping[str, tuple[str, str]],
                    node_selector: Mapping[str, str]) -> dict:
    """One executor's KubernetesExecutorConfig as JSON, as kfp-kubernetes 1.2 (kfp 2.7's
    companion) writes it: `secretAsEnv` by `secretName`, which every KFP v2 backend reads
    (later releases add `secretNameParameter`, which backends before it refuse), and
    `nodeSelector.labels`."""
    config: dict[str, Any] = {}
    by_secret: dict[str, list[dict]] = {}
    for variable, (secret, key) in secret_env.items():
        by_secret.setdefault(secret, []).append({"secretKey": key, "envVar": variable})
    if by_secret:
        config["secretAsEnv"] = [{"secretName": secret, "keyToEnv": keys}
                                 for secret, keys in by_secret.items()]
    if node_selector:
        config["nodeSelector"] = {"labels": dict(node_selector)}
    return config


def platform_spec(executor_configs: Mapping[str, dict]) -> dict:
    """The PlatformSpec document of a package (`platforms.kubernetes.deploymentSpec.executors`,
    by executor label), {} when no executor has anything in it."""
    executors = {label: config for label, config in executor_configs.items() if config}
    if not executors:
        return {}
    return {"platforms": {"kubernetes": {"deploymentSpec": {"executors": executors}}}}
