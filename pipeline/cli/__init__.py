"""`tfrp`, the command line: a thin layer over the runners and components.

- `commands.py`: the product's commands (run, report, compile, submit, examplegen, inspect,
  index, fuzz, data-service, spark-cluster) on the `tfrp` group;
- `bench.py`: `tfrp bench ...`, one command per benchmark of bench/;
- `tfrp.py`: the process: both groups as one, ending with the command's own exit status;
- `output.py`: what a command prints: the libraries' logs kept quiet, errors in one line;
- `options.py`: click options made from the settings the options classes declare.

`python -m pipeline.cli` is `tfrp`.
"""
