"""The project's measurement of what the gate costs, behind ``gated-qwen bench``; importing it imports no torch:

- :mod:`.options`: the sizes, dtypes and :class:`~.options.BenchmarkOptions` (torch-free, for ``--help``);
- :mod:`.measure`: the arms, prefill and decode speed, loading and conversion (:func:`~.measure.run_benchmark`);
- :mod:`.child`: one conversion, copy or load step, alone in a fresh process (its peak memory is its own);
- :mod:`.report`: the result as markdown tables (:func:`~.report.format_markdown`).
"""
