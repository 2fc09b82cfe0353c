from pipeline.cli.tfrp import entry_point

entry_point()
