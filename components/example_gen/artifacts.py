"""What stock ExampleGen sets on an Examples artifact, set the same way by our executors, so
stock components read our outputs without guessing (and without warning that they guessed)."""
from __future__ import annotations


from tfrecord_shards import fileio
from typing import Optional

from tensorflow_metadata.proto.v0 import anomalies_pb2, statistics_pb2
from tfx.components.util import examples_utils
from tfx.proto import example_gen_pb2
from tfx.types import artifact_utils


def set_examples_properties(examples, split_names: list[str], span: int = 0,
                            version: Optional[int] = None) -> None:
    """Split names, the tf.Example payload format, and the span and version (stock
    ExampleGen's driver sets them; a source without spans has span 0, version 0)."""
    examples.split_names = artifact_utils.encode_split_names(sorted(split_names))
    examples_utils.set_payload_format(examples, example_gen_pb2.FORMAT_TF_EXAMPLE)
    examples.span = span
    examples.version = version or 0
    # Stock's driver also writes them as custom properties, which is where stock's resolvers
    # (SpanRangeStrategy) read the span.
    examples.set_int_custom_property("span", span)
    if version is not None:
        examples.set_int_custom_property("version", version)


# Custom properties that list spans: the spans of a range or window one Examples artifact
# holds (stock's `span` holds one number), and the spans Transform analysed and took from its
# analyzer cache.
SPANS, ANALYSED_SPANS, CACHED_SPANS = "spans", "analysed_spans", "cached_spans"


def set_spans(artifact, name: str, spans) -> None:
    artifact.set_string_custom_property(name, ",".join(str(s) for s in spans))


def spans_of(artifact, name: str) -> Optional[tuple[int, ...]]:
    """The spans listed in `artifact`'s (an MLMD artifact's) custom property `name`, or None
    when it has none."""
    if name not in artifact.custom_properties:
        return None
    return tuple(int(s) for s in artifact.custom_properties[name].string_value.split(",") if s)


def split_anomalies(uri: str, splits: list[str], described: bool = False,
                    required: bool = False) -> dict[str, list[str]]:
    """ExampleValidator's findings in the ExampleAnomalies artifact at `uri` (a local path or
    a URI), split by split, each as "feature: short description" (and TFDV's long
    description, when `described`). With `required` (the gate), a split whose findings
    cannot be read is an error, never "no anomalies"."""
    found = {}
    for split in splits:
        path = fileio.join(uri, f"Split-{split}", "SchemaDiff.pb")
        if not fileio.exists(path):
            if required:
                raise FileNotFoundError(f"{path}: ExampleValidator's findings for split "
                                        f"{split!r} are missing, so the gate cannot pass it")
            continue
        proto = anomalies_pb2.Anomalies()
        proto.ParseFromString(fileio.read_bytes(path))
        found[split] = [
            f"{name}: {info.short_description}" + (f" ({info.description})" if described else "")
            for name, info in sorted(proto.anomaly_info.items())]
    return found


def load_statistics(path: str):
    """A StatisticsGen split's FeatureStats.pb (a local path or a URI), as the
    DatasetFeatureStatisticsList TFDV's `load_stats_binary` gives, read through our file
    layer (TFDV's reads through TensorFlow's, which has no s3://)."""
    return statistics_pb2.DatasetFeatureStatisticsList.FromString(fileio.read_bytes(path))
