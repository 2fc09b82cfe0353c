"""ProductionModel: the model in production (the Pusher's latest push) as a Model artifact,
for the Evaluator's baseline and the Trainer's warm start."""
