"""`create_pipeline()`: the one place the components are wired together."""
from __future__ import annotations

import os
from typing import Optional

from tfx import v1 as tfx
from ml_metadata.proto import metadata_store_pb2

from components.example_gen.component import ShardedExampleGen
from components.transform.component import ShardedTransform
from pipeline.configs import PipelineConfig
from pipeline import datasets

TRAINER_RUN_FN = "components.trainer.module.run_fn"
PREPROCESSING_FN = "components.trainer.module.preprocessing_fn"


def create_pipeline(
    config: PipelineConfig,
    metadata_connection_config: Optional[metadata_store_pb2.ConnectionConfig] = None,
) -> tfx.dsl.Pipeline:
    example_gen = ShardedExampleGen(
        source=config.data_root or datasets.taxi_csv_path(), format=config.data_format,
        splits=config.splits, num_shards=config.num_shards, shard_size_mb=config.shard_size_mb,
        compression=config.compression, on_bad_record=config.on_bad_record)
    statistics_gen = tfx.components.StatisticsGen(examples=example_gen.outputs["examples"])
    schema_gen = tfx.components.SchemaGen(
        statistics=statistics_gen.outputs["statistics"], infer_feature_shape=False)
    example_validator = tfx.components.ExampleValidator(
        statistics=statistics_gen.outputs["statistics"], schema=schema_gen.outputs["schema"])
    transform = ShardedTransform(
        examples=example_gen.outputs["examples"], schema=schema_gen.outputs["schema"],
        preprocessing_fn=PREPROCESSING_FN, packed_rows=config.packed_rows,
        num_shards=config.num_shards, shard_size_mb=config.shard_size_mb,
        compression=config.compression)
    # Only data that passed validation is transformed; nothing flows between the two, so the
    # order is stated.
    transform.add_upstream_node(example_validator)
    trainer = tfx.components.Trainer(
        run_fn=TRAINER_RUN_FN,
        examples=transform.outputs["transformed_examples"],
        transform_graph=transform.outputs["transform_graph"],
        schema=schema_gen.outputs["schema"],
        train_args=tfx.proto.TrainArgs(num_steps=config.train_steps),
        eval_args=tfx.proto.EvalArgs(num_steps=config.eval_steps),
        custom_config={"batch_size": config.batch_size},
    )
    pusher = tfx.components.Pusher(
        model=trainer.outputs["model"],
        push_destination=tfx.proto.PushDestination(
            filesystem=tfx.proto.PushDestination.Filesystem(
                base_directory=os.path.abspath(config.serving_dir))),
    )
    return tfx.dsl.Pipeline(
        pipeline_name=config.pipeline_name,
        pipeline_root=os.path.abspath(config.pipeline_root),
        components=[example_gen, statistics_gen, schema_gen, example_validator, transform,
                    trainer, pusher],
        enable_cache=config.enable_cache,
        metadata_connection_config=metadata_connection_config,
        beam_pipeline_args=list(config.beam_args),
    )
