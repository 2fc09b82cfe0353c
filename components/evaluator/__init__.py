"""The Evaluator: ours (TFMA's metrics and validation without Beam) and stock TFX's, each
taking a ProductionModel's empty artifact as "no baseline yet"."""
