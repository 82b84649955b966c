"""The tools around the model: :mod:`.generation` and :mod:`.evaluation` (a module each), and a package for each
of :mod:`.analysis` (the paper's instruments), :mod:`.training` (on transformers' Trainer) and :mod:`.benchmark`
(the measurement behind ``gated-qwen bench``)."""
