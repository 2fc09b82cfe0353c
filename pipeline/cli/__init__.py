"""`tfrp`, the command line: a thin layer over the runners and components, one module per
command group (as kfp's SDK keeps `kfp/cli/run.py`, `pipeline.py`, ...).

- `group.py`: the `tfrp` group, its -v flag, and the pipeline settings commands take;
- `runs.py`: `run` and `report`, a local run and its page;
- `deploy.py`: `compile` and `submit`, for Kubeflow Pipelines and Vertex AI;
- `records.py`: `examplegen`, `inspect` and `index`, without a pipeline;
- `servers.py`: `data-service` and `spark-cluster`, servers that run until interrupted;
- `tfrp.py`: the process, ending with the command's own exit status;
- `output.py`: what a command prints: the libraries' logs kept quiet, errors in one line;
- `options.py`: click options made from the settings the options classes declare.

`python -m pipeline.cli` is `tfrp`. The benchmarks and the fuzzer are not `tfrp` commands:
they run from a checkout as `python -m bench ...` (bench/cli.py).
"""
