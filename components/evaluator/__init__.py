"""Stock TFX's Evaluator, taking a ProductionModel's empty artifact as "no baseline yet"."""
