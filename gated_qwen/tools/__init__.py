"""The research tools around the model: generation, analysis, evaluation, training and benchmarks."""
