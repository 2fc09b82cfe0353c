"""Every setting of a pipeline run, in one dataclass, overridable from YAML and the CLI.

Precedence: the dataclass defaults, then a YAML file, then `--set key=value` and the named
CLI options. Settings left at None take the dataset's own default (label, image shape, schema).

A component setting's default lives in its component's options class; the field here names
it (`batch_size: int = InputConfig.batch_size`), or holds the options whole (`sharding`), and
`example_gen_options()`, `transform_options()` and `trainer_options()` hand every setting to
the options field of the same name. A nested setting keeps its own name in YAML and `--set`
(`num_shards: 4`). docs/ARCHITECTURE.md walks through adding one.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import typing
from typing import Any, Mapping, Optional

import yaml

from components.transform import taxi
from tfrecord_shards import fileio
from components.example_gen.options import ExampleGenOptions
from tfrecord_shards.options import check_settings, flat_fields, from_flat, setting, settings_for
from components.production_model.options import ProductionModelOptions
from tfrecord_shards.shards import ShardingOptions
from components.trainer import tasks
from components.trainer.options import DEFAULT_SEED, InputConfig, TrainerOptions
from components.transform.options import TransformOptions
from pipeline.kubernetes_platform import TaskEnvironment
from pipeline.resources import TaskResources

DEFAULT_ROOT = "tfrp_runs"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMAS_DIR = os.path.join(REPO_ROOT, "schemas")
# The image the Dockerfile builds (`make image`); the Makefile uses the same name and tag.
DEFAULT_IMAGE = "tfrecord-pipeline"
DEFAULT_IMAGE_TAG = "0.1.0"
# Beam flags naming the workers' container; the user's own wins over ours.
CONTAINER_FLAGS = ("--sdk_container_image", "--worker_harness_container_image")
# Where the Dockerfile puts the project inside the image.
CONTAINER_WORKDIR = "/pipeline"
# The Evaluators a pipeline may run (components/evaluator/component.py).
EVALUATORS = ("fast", "stock")
# The preprocessing_fn setting that derives the Transform from the schema.
SCHEMA_PREPROCESSING = "schema"

# What each bundled dataset needs beyond the defaults. Your own data_root is read with the
# settings of `dataset` (taxi unless set), so set label_key and preprocessing_fn for it.
DATASET_DEFAULTS: dict[str, dict[str, Any]] = {
    # The taxi schema is curated (schemas/taxi/schema.pbtxt says how), so validation gates.
    "taxi": {"schema": "import", "preprocessing_fn": taxi.PREPROCESSING_FN,
             "train_steps": 1000, **taxi.TRAINER_SETTINGS},
    "digits": {"label_key": "label", "image_shape": [8, 8, 1], "num_classes": 10,
               "task": "multiclass", "train_steps": 1000,
               "schema": "import", "preprocessing_fn": SCHEMA_PREPROCESSING},
    # Your own folder of images with a labels.csv (filename,label): set data_root,
    # image_shape (images are resized to it) and num_classes.
    "images": {"label_key": "label", "schema": "infer", "task": "multiclass",
               "train_steps": 1000, "preprocessing_fn": SCHEMA_PREPROCESSING},
    # Your own table (CSV, Parquet, JSON Lines, TFRecord): set data_root and label_key. The
    # schema is inferred, Transform derives from it, and the task from the label's values.
    # Its budget is larger: a table's model is small and fast (diamonds' 36k training rows
    # trained 7,100 steps, to their early stop, in 18 s), max_epochs and early stopping end
    # a small table's or a plateaued one's run first, and at 1,000 steps diamonds' cut
    # grades were still improving (accuracy 0.745; 0.79 by 3,000 steps).
    "table": {"schema": "infer", "preprocessing_fn": SCHEMA_PREPROCESSING,
              "train_steps": 10_000},
}
# The settings a dataset with no bundled data cannot go without.
REQUIRED_SETTINGS = {"images": ("data_root", "image_shape", "num_classes"),
                     "table": ("data_root", "label_key")}


@dataclasses.dataclass
class PipelineConfig:
    # Fields declared with `setting(..., help)` are also `tfrp run` flags; every field is a
    # YAML key and a `--set` name.
    pipeline_name: Optional[str] = setting(None, "The pipeline's name (default: "
                                                 "tfrp-<dataset>).")
    dataset: str = setting(
        "taxi", "taxi or digits, both bundled; images: your folder of images and labels.csv "
        "as --data-root; table: your CSV, Parquet, JSONL or TFRecord data as --data-root, "
        "with --set label_key=COLUMN.", choices=tuple(DATASET_DEFAULTS))
    data_root: Optional[str] = setting(
        None, "A file or folder (local, gs://, ...) to read instead of the bundled dataset.")
    data_format: str = ExampleGenOptions.format
    splits: str = ExampleGenOptions.splits
    split_key: Optional[str] = None
    # Shards of ExampleGen and Transform: num_shards, shard_size_mb, compression,
    # compression_level (tfrecord_shards/shards.py).
    sharding: ShardingOptions = dataclasses.field(default_factory=ShardingOptions)
    # What each heavy task of a compiled pipeline asks its cluster for: trainer_cpu,
    # trainer_memory, trainer_accelerator, transform_cpu, ... (pipeline/resources.py).
    resources: TaskResources = dataclasses.field(default_factory=TaskResources)
    # Environment variables of every compiled task, plain and from Kubernetes secrets:
    # task_env, task_secret_env (pipeline/kubernetes_platform.py).
    environment: TaskEnvironment = dataclasses.field(default_factory=TaskEnvironment)
    # A compiled task that fails runs again up to task_retries times (0: never), the first
    # after task_retry_backoff seconds and each next after twice the last (kfp's set_retry).
    task_retries: int = setting(2, "Retries of a failed task on Kubeflow or Vertex (0: none).",
                                minimum=0, flag=False)
    task_retry_backoff: int = setting(30, "Seconds before a failed task's first retry on "
                                          "Kubeflow or Vertex.",
                                      minimum=0, maximum=3600, flag=False)
    on_bad_record: str = ExampleGenOptions.on_bad_record
    # ExampleGen's engine: "beam" (beam_runner and the Beam flags below) or "spark"
    # (spark_master, e.g. spark://host:7077 or yarn; unset: local[*]). The other components
    # keep their Beam args.
    engine: str = ExampleGenOptions.engine
    spark_master: Optional[str] = ExampleGenOptions.spark_master
    spark_conf: Optional[dict] = ExampleGenOptions.spark_conf
    # On Spark, and on a Beam runner outside this process, a plain CSV larger than this many
    # bytes is read in ranges of it, one task each, so one large file spreads over workers.
    piece_bytes: int = ExampleGenOptions.piece_bytes
    # Pre-split inputs (split -> pattern under data_root) and the spans to read
    # (range_config); ExampleGen's settings of those names.
    input_config: Optional[dict] = ExampleGenOptions.input_config
    range_config: Optional[dict] = ExampleGenOptions.range_config
    # Train on the latest N spans: ExampleGen processes each new span once, a resolver (stock's
    # SpanRangeStrategy) hands Transform the window, and tf.Transform's analyzer cache, kept
    # under the pipeline root, spares the spans it has analysed before.
    spans: int = setting(1, "Train on the latest N spans of a {SPAN} source (a rolling "
                         "window); 1: the latest span alone.", minimum=1)
    # "infer" (SchemaGen), "import" (ImportSchemaGen from schemas/<dataset>/schema.pbtxt),
    # or the path of a schema.pbtxt to import.
    schema: Optional[str] = None
    # A `module.function` preprocessing_fn, or "schema" to derive one from the schema.
    preprocessing_fn: Optional[str] = None
    # Stop the run before Transform when ExampleValidator finds anomalies (false: go on, and
    # the summary lists them).
    fail_on_anomalies: bool = TransformOptions.fail_on_anomalies
    # Transform writes this many rows per tf.Example (0: one row per Example).
    packed_rows: int = TransformOptions.packed_rows
    # Stock Transform's: off, ShardedTransform also writes the statistics, schemas and
    # anomalies of the rows it analysed and wrote; on, those outputs do not exist.
    disable_statistics: bool = TransformOptions.disable_statistics
    label_key: Optional[str] = None
    # A `module.function` computing the label from raw features, and the features it reads.
    label_fn: Optional[str] = None
    label_inputs: Optional[list[str]] = None
    # Features the model must not see (default: an image dataset's size and format columns).
    exclude: Optional[list[str]] = None
    # binary | multiclass | regression; unset (or auto): inferred from the label's values in
    # the first source file (components/trainer/tasks.py has the rules).
    task: Optional[str] = None
    task_reason: str = TrainerOptions.task_reason
    # [height, width, channels] of the "image" feature; set for image datasets.
    image_shape: Optional[list[int]] = None
    image_dtype: str = TrainerOptions.image_dtype
    # "raw": Transform decodes and resizes images to image_shape once and stores the pixels;
    # the Trainer then reads them with no decode (more disk, far less CPU per epoch).
    image_storage: str = TransformOptions.image_storage
    num_classes: Optional[int] = None
    train_steps: Optional[int] = setting(
        None, "Training steps (default: the dataset's: " + ", ".join(
            f"{name} {values['train_steps']:,}" for name, values in DATASET_DEFAULTS.items())
        + "; max_epochs and early stopping may end training sooner).")
    eval_steps: int = setting(100, "Evaluation steps.")
    # Reporting windows: train_steps is cut into this many epochs of input-wait figures.
    epochs: int = TrainerOptions.epochs
    max_epochs: int = TrainerOptions.max_epochs
    # The Trainer's weights are chosen, and training stopped early, on the Examples'
    # validation_split when they have one ("": never), else on validation_fraction of the
    # train split held out by hash; never on the eval split, which the Evaluator blesses on.
    validation_split: str = TrainerOptions.validation_split
    validation_fraction: float = TrainerOptions.validation_fraction
    early_stopping_patience: int = TrainerOptions.early_stopping_patience
    early_stopping_min_steps: int = TrainerOptions.early_stopping_min_steps
    # Below this many train rows the chosen length is trained again on every train row
    # (the held-out tenth too); 0: never.
    refit_below_rows: int = TrainerOptions.refit_below_rows
    # Below small_table_rows train rows, batches of at most small_table_batch_size (0: never).
    small_table_rows: int = TrainerOptions.small_table_rows
    small_table_batch_size: int = TrainerOptions.small_table_batch_size
    # A train split of at least twice this many rows is scaled by an evenly spread sample of
    # about this many (0: every row).
    scaling_sample_rows: int = TrainerOptions.scaling_sample_rows
    # A table's numbers also enter the model through sines at this many trained frequencies
    # (0: off), drawn from N(0, periodic_sigma) at the start.
    periodic_frequencies: int = TrainerOptions.periodic_frequencies
    periodic_sigma: float = TrainerOptions.periodic_sigma
    batch_size: int = InputConfig.batch_size
    seed: int = DEFAULT_SEED  # weight initialisation and input shuffling
    # "none", "memory" or a file prefix: where parsed batches are cached after one epoch.
    cache: str = InputConfig.cache
    # Read damaged training shards past their bad records (logged and counted).
    skip_corrupt: bool = InputConfig.skip_corrupt
    # "buffer" (files shuffled, records through shuffle_buffer) or "global" (a permutation
    # of every record each epoch, read by the records' index).
    shuffle: str = InputConfig.shuffle
    shuffle_buffer: int = InputConfig.shuffle_buffer
    # "grpc://host:port" of a tf.data service dispatcher: the Trainer's input parsing runs on
    # the service's workers (`tfrp data-service dispatcher|worker`). Unset: in the trainer.
    data_service: Optional[str] = InputConfig.data_service
    # Checkpoint model, optimizer and input position every N steps (0: never), into
    # checkpoint_dir (default: the Trainer's model_run_dir); a restart resumes mid-epoch.
    checkpoint_every: int = TrainerOptions.checkpoint_every
    checkpoint_dir: Optional[str] = TrainerOptions.checkpoint_dir
    # Start from the production model's weights (the latest push, TFX's base_model).
    warm_start: bool = TrainerOptions.warm_start
    # "fast": our Evaluator (TFMA's metrics, slices and validation on large batches, no Beam);
    # "stock": TFX's own (TFMA on Beam), for what ours refuses (plots, example weights,
    # confidence intervals, UDF metrics). Both write the same artifacts.
    evaluator: str = setting("fast", "The Evaluator: fast (ours) or stock (TFMA on Beam).",
                             choices=EVALUATORS)
    # Evaluator blesses the model only when every metric reaches its bound (AUC: binary only).
    min_accuracy: float = 0.8
    min_auc: Optional[float] = 0.85
    # Regression: blessed when the eval MSE is at most this; unset, the MSE of predicting the
    # label's mean (its variance in the rows the task was inferred from).
    max_mse: Optional[float] = None
    # And against production: the Evaluator also scores the model in production (the latest push)
    # on the same eval rows, and blesses the new one only if its task metric (accuracy, or
    # MSE) is no worse than that model's by more than this (absolute, in the metric's units).
    # The first run, with no blessed model yet, is judged by the bounds alone. None: bounds
    # alone, always.
    baseline_tolerance: Optional[float] = 0.0
    # Beam: DirectRunner here; DataflowRunner, FlinkRunner or SparkRunner on a cluster.
    beam_runner: str = "DirectRunner"
    # DirectRunner in worker processes (0: one per core); unset runs in this process.
    direct_num_workers: Optional[int] = None
    # glibc's allocator arenas for a local run's process (`tfrecord_shards.memory.limit_arenas`),
    # whose components share it. Unset: glibc's default, 8 a core. 4 kept the 30M taxi run's
    # stages within 130 MiB of the 3M run's (+286 unset), but small runs' Transform took 0.4-0.8
    # s longer (bench/RESULTS.md, 2026-12-02).
    allocator_arenas: Optional[int] = setting(
        None, "Allocator arenas of a local run's process (glibc); fewer keep a long run's "
              "memory flatter.", minimum=1)
    # glibc's arenas each keep up to 64 MiB free at their top, which `malloc_trim` leaves
    # resident (`tfrecord_shards.memory.cap_kept_free_memory`). 4 MiB kept the 30M taxi run's
    # stage peaks 430 MiB lower (1,299 MiB at most against 1,738) but took 11 % longer:
    # large blocks are mapped afresh each time (bench/RESULTS.md, 2026-12-04).
    allocator_kept_free_bytes: Optional[int] = setting(
        None, "The most free memory each glibc allocator arena of a local run's process "
              "keeps, and the size from which blocks are mapped apart; lower peaks for "
              "slower stages (unset: glibc's own, which rise to 64 MiB).", minimum=4096)
    dataflow_project: Optional[str] = None
    dataflow_region: Optional[str] = None
    dataflow_temp_location: Optional[str] = None
    dataflow_machine_type: Optional[str] = None
    dataflow_max_num_workers: Optional[int] = None
    # Any further Beam flags, passed through as given.
    beam_args: list[str] = dataclasses.field(default_factory=list)
    image: str = DEFAULT_IMAGE
    image_tag: str = setting(DEFAULT_IMAGE_TAG, "Tag of the container image the components "
                                                "run.")
    # The image of a compiled task given an accelerator (TensorFlow's CUDA build, `make
    # image-gpu`). Unset: <image>:<image_tag>-gpu.
    gpu_image: Optional[str] = None
    # Where the image holds the project (the Dockerfile's WORKDIR): a compiled pipeline reads
    # the bundled schemas there. An image of your own may put it elsewhere.
    image_workdir: str = CONTAINER_WORKDIR
    output_root: str = setting(DEFAULT_ROOT, "Local runs write everything below this one "
                                             "folder.")
    # Override the folders derived from output_root (gs:// paths on Kubeflow and Vertex).
    pipeline_root: Optional[str] = setting(None, "Where artifacts go (gs://... for Kubeflow "
                                                 "and Vertex).")
    serving_dir: Optional[str] = None
    metadata_path: Optional[str] = None
    # Where schemas/<dataset>/schema.pbtxt lives: the repo here, the image's copy in a container.
    schemas_dir: str = SCHEMAS_DIR
    enable_cache: bool = True

    def __post_init__(self) -> None:
        check_settings(self)
        if self.pipeline_name is None:
            self.pipeline_name = f"tfrp-{self.dataset}"
        for name, value in DATASET_DEFAULTS[self.dataset].items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        missing = [name for name in REQUIRED_SETTINGS.get(self.dataset, ())
                   if getattr(self, name) is None]
        if missing:
            raise ValueError(f"dataset {self.dataset} needs {', '.join(missing)}")
        tasks.check_task(self.task)
        if self.image_shape is not None and len(self.image_shape) != 3:
            raise ValueError(f"image_shape is [height, width, channels], not {self.image_shape}")
        if self.beam_runner == "DataflowRunner":
            missing = [name for name in ("dataflow_project", "dataflow_region",
                                         "dataflow_temp_location") if not getattr(self, name)]
            if missing:
                raise ValueError(f"DataflowRunner needs {', '.join(missing)}")

    # -- derived settings ---------------------------------------------------------------------
    @property
    def image_uri(self) -> str:
        return f"{self.image}:{self.image_tag}"

    @property
    def gpu_image_uri(self) -> str:
        return self.gpu_image or f"{self.image_uri}-gpu"

    @property
    def resolved_pipeline_root(self) -> str:
        return self.pipeline_root or fileio.join(self.output_root, "pipelines",
                                                  self.pipeline_name)

    @property
    def resolved_serving_dir(self) -> str:
        return self.serving_dir or fileio.join(self.output_root, "serving", self.pipeline_name)

    @property
    def resolved_metadata_path(self) -> str:
        return self.metadata_path or fileio.join(self.output_root, "metadata",
                                                  self.pipeline_name, "metadata.db")

    @property
    def schema_file(self) -> Optional[str]:
        """The schema ImportSchemaGen reads, or None when SchemaGen infers one."""
        if self.schema == "infer":
            return None
        if self.schema == "import":
            return fileio.join(self.schemas_dir, self.dataset, "schema.pbtxt")
        return self.schema

    @property
    def beam_pipeline_args(self) -> list[str]:
        args = [f"--runner={self.beam_runner}"]
        if self.beam_runner == "DirectRunner" and self.direct_num_workers is not None:
            args += [f"--direct_num_workers={self.direct_num_workers}",
                     "--direct_running_mode=multi_processing"]
        flags = {"project": self.dataflow_project, "region": self.dataflow_region,
                 "temp_location": self.dataflow_temp_location,
                 "machine_type": self.dataflow_machine_type,
                 "max_num_workers": self.dataflow_max_num_workers}
        if self.beam_runner == "DataflowRunner":
            args += [f"--{flag}={value}" for flag, value in flags.items() if value is not None]
        args += self._beam_s3_args(args + self.beam_args)
        args += self.beam_args
        if not any(arg.split("=")[0] in CONTAINER_FLAGS for arg in args):
            # Remote workers run the components' image, so they import our code and TFX's;
            # the DirectRunner runs this machine's Python and ignores it. Left unset, every
            # TFX Beam executor packs TFX's source into a 52 MB sdist in the temp folder
            # (2.7 s, never deleted) for workers that would not need it.
            args.append(f"--sdk_container_image={self.image_uri}")
        return args

    def _beam_s3_args(self, given: list[str]) -> list[str]:
        """Beam's own S3 flags, from the variables our file layer reads (fileio), when a
        path is on s3://: Beam's S3 filesystem takes no AWS_ENDPOINT_URL of its own. Never
        the credentials, which would land in a compiled pipeline: boto3 reads them from the
        same variables itself."""
        paths = (self.pipeline_root, self.data_root, self.serving_dir)
        if not any(p and p.startswith("s3://") for p in paths):
            return []
        values = {"s3_endpoint_url": fileio.s3_endpoint(), "s3_region_name": fileio.s3_region()}
        named = {arg.split("=")[0] for arg in given}
        return [f"--{flag}={value}" for flag, value in values.items()
                if value and f"--{flag}" not in named]

    # -- the components' options --------------------------------------------------------------
    def example_gen_options(self, source: str) -> ExampleGenOptions:
        return from_flat(ExampleGenOptions, {**settings_for(ExampleGenOptions, self),
                                             "source": source, "format": self.data_format})

    @property
    def analyzer_cache_dir(self) -> Optional[str]:
        """Where Transform keeps each span's analysis across runs (a window of spans only)."""
        return fileio.join(self.resolved_pipeline_root, "analyzer_cache") \
            if self.spans > 1 else None

    def transform_options(self) -> TransformOptions:
        settings = settings_for(TransformOptions, self)
        if self.preprocessing_fn == SCHEMA_PREPROCESSING:
            settings["preprocessing_fn"] = None  # derived from the schema
        return from_flat(TransformOptions, settings)

    def production_model_options(self) -> ProductionModelOptions:
        return ProductionModelOptions(serving_dir=self.resolved_serving_dir)

    def trainer_options(self) -> TrainerOptions:
        settings = {k: v for k, v in settings_for(TrainerOptions, self).items()
                    if v is not None}  # None: the options' own default
        if self.image_shape:
            settings["images"] = {"image": list(self.image_shape)}
        return TrainerOptions.from_custom_config(settings)

    # -- building one -------------------------------------------------------------------------
    @classmethod
    def create(cls, yaml_path: Optional[str] = None,
               overrides: Optional[Mapping[str, Any]] = None) -> "PipelineConfig":
        """Defaults < YAML file < overrides (the CLI); None in overrides means "not given"."""
        settings: dict[str, Any] = {}
        if yaml_path:
            settings.update(load_yaml(yaml_path))
        settings.update({k: v for k, v in (overrides or {}).items() if v is not None})
        return from_flat(cls, {name: coerce(name, value) for name, value in settings.items()})

    def replace(self, **changes: Any) -> "PipelineConfig":
        return dataclasses.replace(self, **changes)


@functools.lru_cache(maxsize=None)
def field_types() -> dict[str, Any]:
    """Every setting's type by its flat name (nested options' settings by their own)."""
    return {**typing.get_type_hints(PipelineConfig),
            **{field.name: hint for field, hint in flat_fields(PipelineConfig)}}


def coerce(name: str, value: Any) -> Any:
    """A value from YAML or a `--set key=value` string, as the field's type."""
    types = field_types()
    if name not in types:
        raise KeyError(f"unknown setting {name!r}; settings are: {', '.join(sorted(types))}")
    hint = types[name]
    optional = type(None) in typing.get_args(hint)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if typing.get_origin(hint) is typing.Union and args else hint
    if value is None or not isinstance(value, str):
        if base is float and isinstance(value, int):
            return float(value)
        return value
    if optional and value.lower() in ("none", "null", ""):
        return None
    if base is bool:
        if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(f"{name}: expected true or false, not {value!r}")
        return value.lower() in ("true", "1", "yes")
    if base in (int, float):
        try:
            return base(value)
        except ValueError:
            raise ValueError(f"{name}: expected a number, not {value!r}") from None
    if typing.get_origin(base) is list:
        parsed = yaml.safe_load(value) if value.strip().startswith("[") else value.split(",")
        inner = typing.get_args(base)[0]
        return [inner(v) for v in parsed]
    return value


def load_yaml(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    unknown = sorted(set(data) - set(field_types()))
    if unknown:
        raise KeyError(f"{path}: unknown settings {unknown}")
    return data


def parse_assignments(pairs: list[str]) -> dict[str, str]:
    """`key=value` strings from `--set`."""
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--set expects key=value, got {pair!r}")
        settings[key.strip().replace("-", "_")] = value
    return settings
