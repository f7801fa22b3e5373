"""Where servers meet the library.

- :mod:`adaptive.integrations.transformers`: an ``"adaptive"`` attention implementation
  for transformers' ``AttentionInterface`` and :func:`~adaptive.integrations.transformers.patch`,
  which puts a model's ``nn.Linear`` layers on adaptive gemm/spmm.
- :mod:`adaptive.integrations.static`: greedy decode steps over a static key/value cache,
  one step captured in a CUDA graph and replayed
  (:class:`~adaptive.integrations.static.StaticDecode`).

Nothing here is imported by ``import adaptive``; torch and transformers load when a
function of these modules is first called (install them with ``adaptive-dispatch[llm]``).
"""
