"""Source formats: every format becomes a stream of Arrow RecordBatches plus bad records.

- `base`: what every reader shares (errors, bad records, the profile, opening a file).
- one module per format (`csv_source`, `jsonl_source`, `parquet_source`, `tfrecord_source`,
  `image_source`), each ending in a `FORMAT` that names its extensions, reader and profiler;
- `registry`: the formats by name; `locate`: resolving, detecting, listing, fingerprinting.

Adding a format is one new module here and one line in `registry.FORMATS`.
"""
