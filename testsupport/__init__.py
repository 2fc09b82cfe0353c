"""What the tests and the benchmarks both use, kept apart from bench/ so a benchmark can change
without breaking a test: seeded taxi-like data (`data.py`), real tables found in installed data
packages (`corpus.py`), and the Trainer's fault drills (`trainer_faults.py`)."""
