"""The paper's instruments (arXiv 2505.06708), one module per concern; each works on a model as it is:

- :mod:`.gates`: gate values (:func:`~.gates.record_gates`, :func:`~.gates.summarize_gates`) and gate
  ablation (:func:`~.gates.override_gates`);
- :mod:`.sinks`: attention sinks (:func:`~.sinks.record_attention`, :func:`~.sinks.attention_sink`) and
  massive activations (:func:`~.sinks.massive_activations`);
- :mod:`.routing`: the load of a mixture of experts' router (:func:`~.routing.router_load`);
- :mod:`.perplexity`: sliding-window perplexity (:func:`~.perplexity.perplexity`);
- :mod:`.extrapolation`: perplexity by context length, with or without RoPE scaling;
- :mod:`.figures`: PNG figures of the above (matplotlib).
"""
