"""What `tfrp run` shows a person: a line per component as it finishes, and no library noise
unless asked for with -v."""
from __future__ import annotations

import re

import pytest


COMPONENTS = ("ShardedExampleGen", "StatisticsGen", "ImportSchemaGen", "ExampleValidator",
              "ShardedTransform", "production_model", "Trainer", "Evaluator", "Pusher")
NOISE = ("cuFFT", "property_predicate", "payload_format", "FutureWarning")


@pytest.fixture(scope="module")
def runs(taxi_cli_run, taxi_cli_rerun):
    """The 2,000-trip slice run quietly (the shared taxi run), then again with -v into the
    same store (cached)."""
    return taxi_cli_run[2], taxi_cli_rerun[1]


@pytest.mark.pipeline
def test_run_prints_a_line_per_component_with_state_seconds_and_output(runs):
    quiet, verbose = runs
    # The rerun reuses all but the model in production (now the first run's push), the
    # Evaluator, which compares the model with it, and the Pusher.
    rerun_states = dict.fromkeys(COMPONENTS, "cached") | dict.fromkeys(
        ("production_model", "Evaluator", "Pusher"), "ran")
    for result, states in ((quiet, dict.fromkeys(COMPONENTS, "ran")), (verbose, rerun_states)):
        for name, state in states.items():
            line = re.search(rf"^  {name}\s+{state}\s+(\d+\.\d) s  (.*)$", result.stdout, re.M)
            assert line, f"no {state} line for {name}:\n{result.stdout}"
    assert re.search(r"ShardedExampleGen\s+ran\s+\S+ s  rows eval=[\d,]+ train=[\d,]+ in \d+ shard",
                     quiet.stdout)
    assert re.search(r"ImportSchemaGen\s+ran\s+\S+ s  schema of \d+ features", quiet.stdout)
    assert re.search(r"ExampleValidator\s+ran\s+\S+ s  0 anomalies", quiet.stdout)
    assert re.search(r"Evaluator\s+ran\s+\S+ s  .*accuracy=[\d.]+.*; blessed", quiet.stdout)
    assert re.search(r"Pusher\s+ran\s+\S+ s  pushed", quiet.stdout)
    assert re.search(r"production_model\s+ran\s+\S+ s  no model in production yet$",
                     quiet.stdout, re.M)
    assert re.search(r"production_model\s+ran\s+\S+ s  model in production \S+/\d+$",
                     verbose.stdout, re.M)
    assert re.search(r"^Task: binary$", quiet.stdout, re.M)  # the taxi dataset's setting
    # The Evaluator scored Transform's split, and serving_default agreed on the first rows.
    assert re.search(r"^Scored: Transform's eval split through score_transformed; "
                     r"serving_default on the first [\d,]+ rows differed by at most \S+$",
                     quiet.stdout, re.M), quiet.stdout
    # A tenth of the train split, held out of training, chose the training length; the
    # slice's 1,340 train rows are under refit_below_rows, so all of them then trained the
    # exported model for that length.
    trainer = re.search(r"^Trainer: ([\d,]+) rows trained; ([\d,]+) validation rows chose the "
                        r"training length \(10% of the train split, held out by a hash of each "
                        r"packed row \(its block and place in it\)\); then all ([\d,]+) train "
                        r"rows trained the exported model for [\d,]+ steps; eval split "
                        r"untouched$", quiet.stdout, re.M)
    assert trainer, quiet.stdout
    trained, chose, refit = (int(n.replace(",", "")) for n in trainer.groups())
    assert 0 < chose < trained and refit == trained + chose


@pytest.mark.pipeline
def test_library_noise_is_hidden_by_default_and_back_with_verbose(runs):
    quiet, verbose = runs
    everything = quiet.stdout + quiet.stderr
    for noise in NOISE:
        assert noise not in everything, f"{noise!r} in a quiet run:\n{everything[-3000:]}"
    loud = verbose.stdout + verbose.stderr
    for noise in ("cuFFT", "property_predicate"):
        assert noise in loud, f"{noise!r} missing with -v"
    # With absl's warnings shown, none is about payload_format: our artifacts set it, as stock
    # ExampleGen's do.
    assert "does not have payload_format custom property" not in loud


def test_live_line_names_the_component_running(tmp_path, capsys):
    """On a terminal the progress thread shows the running component; the store here is a
    real SQLite ML Metadata store with one execution still running."""
    from ml_metadata import metadata_store
    from ml_metadata.proto import metadata_store_pb2

    from pipeline import progress

    path = str(tmp_path / "metadata.db")
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = path
    store = metadata_store.MetadataStore(config)
    with progress.RunProgress(path, echo=print, live=True, interval=0.05):
        node_type = store.put_context_type(metadata_store_pb2.ContextType(name="node"))
        execution_type = store.put_execution_type(metadata_store_pb2.ExecutionType(
            name="Trainer"))
        [execution_id] = store.put_executions([metadata_store_pb2.Execution(
            type_id=execution_type, last_known_state=metadata_store_pb2.Execution.RUNNING)])
        [context_id] = store.put_contexts([metadata_store_pb2.Context(
            type_id=node_type, name="tfrp-test.Trainer")])
        store.put_attributions_and_associations(
            [], [metadata_store_pb2.Association(context_id=context_id,
                                                execution_id=execution_id)])
        import time

        time.sleep(0.5)
    shown = capsys.readouterr().out
    assert re.search(r"\r  Trainer\s+running\s+\d+ s \.\.\.", shown), repr(shown)


@pytest.mark.pipeline
def test_each_component_is_printed_once(runs):
    """The progress prints a line per component as it finishes; the summary after it does not
    list them again."""
    quiet, _ = runs
    for name in COMPONENTS:
        lines = re.findall(rf"^  {name}\s", quiet.stdout, re.M)
        assert len(lines) == 1, f"{name} printed {len(lines)} times:\n{quiet.stdout}"
    assert re.search(r"^Reused from cache: 0 of 9 components$", quiet.stdout, re.M)
