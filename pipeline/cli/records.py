"""`tfrp examplegen`, `tfrp inspect` and `tfrp index`: ExampleGen on its own, and a look
into TFRecord files without a pipeline."""
from __future__ import annotations

import click

from tfrecord_shards import fileio
from components.example_gen.options import ExampleGenOptions
from tfrecord_shards.options import from_flat
from tfrecord_shards.tfrecord_io import CorruptRecordError
from pipeline.cli.group import main
from pipeline.cli.options import given_settings, setting_options, usage_error


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("source")
@click.argument("output_dir")
@setting_options(ExampleGenOptions)
@click.pass_context
def examplegen(ctx, source, output_dir, **named) -> None:
    """Convert SOURCE into sharded TFRecords in OUTPUT_DIR (no TFX orchestration).

    Extra arguments go to Beam, e.g. --runner=DataflowRunner --direct_num_workers=2.
    Options left out take ExampleGenOptions' defaults.
    """
    # ExampleGen's engine: 36 ms to import; `tfrp --help` and inspect need none of it.
    from components.example_gen import engine

    try:
        options = from_flat(ExampleGenOptions, {
            **given_settings(ExampleGenOptions, named), "source": source})
    except (KeyError, ValueError) as e:
        raise usage_error(e) from None
    try:
        manifest = engine.run(options, output_dir, beam_pipeline_args=ctx.args,
                                   progress=True)
    except engine.InputError as e:
        raise click.ClickException(str(e)) from None
    for split, info in sorted(manifest["splits"].items()):
        click.echo(f"{split}: {info['rows']:,} rows in {len(info['shards'])} shard(s), "
                   f"{info['bytes'] / 2**20:.1f} MiB")
    unlabelled = manifest.get("rows_unlabelled", 0)
    click.echo(f"quarantined: {manifest['rows_quarantined']:,}  "
               + (f"without a label: {unlabelled:,}  " if unlabelled else "") +
               f"schema: {fileio.join(output_dir, 'schema.pbtxt')}")


@main.command()
@click.argument("path")
@click.option("--limit", default=10, show_default=True, type=int)
@click.option("--format", "fmt", default="table", show_default=True,
              type=click.Choice(["table", "json"]))
@click.option("--count", is_flag=True,
              help="Print each file's record count (from our manifest or a record index, "
                   "without reading the data, when there is one) and the total.")
def inspect(path, limit, fmt, count) -> None:
    """Print records of a TFRecord file or folder, typed by its schema.pbtxt if there is one."""
    # example_rows, record_index, shards: 21 ms to import; `tfrp --help` needs none.
    from tfrecord_shards import example_rows, record_index, shards
    if not fileio.exists(path):
        raise click.BadParameter(f"{path}: no such file or folder", param_hint="PATH")
    try:
        if count:
            total = 0
            for file in example_rows.record_files(path):
                records, how = record_index.count(file)
                total += records
                click.echo(f"{file}: {records:,} records ({how})")
            click.echo(f"total: {total:,} records")
            return
        rows = list(example_rows.iter_rows(path, limit=limit))
    except (CorruptRecordError, shards.IncompleteOutputError) as e:
        raise click.ClickException(str(e))
    click.echo(example_rows.format_rows(rows, fmt))


@main.command()
@click.argument("paths", nargs=-1, required=True)
def index(paths) -> None:
    """Write the record index of TFRecord files (ours, stock ExampleGen's, anyone's; plain or
    gzip) in one pass each, without TensorFlow: a plain file's `.idx` (offset and length of
    each record, the format DALI and the `tfrecord` package read), a gzip file's members
    (`.gzi.json`). A file in a `Split-*` folder gets its index under the artifact's `index/`
    folder, so readers that glob the split read no index as data."""
    # example_rows, record_index: 21 ms to import; `tfrp --help` needs neither.
    from tfrecord_shards import example_rows, record_index

    for path in paths:
        for file in example_rows.record_files(path):
            try:
                built = record_index.RecordIndex.build(file)
            except CorruptRecordError as e:
                raise click.ClickException(str(e))
            written = built.save()
            click.echo(f"{file}: {built.records:,} records -> {written}")
