"""Every figure vitlab draws lives here, drawn with matplotlib on the Agg backend (no display) and imported
lazily: nothing here is imported by ``vitlab --help``, ``vitlab train`` or :func:`vitlab.create_model`; a study
or command imports the module of its figures when it draws them.

- :mod:`~vitlab.plots.figure`: the shared style (a figure on its own Agg canvas, PNG written atomically, colours);
  :mod:`~vitlab.plots.axes`: the log-2 depth axis the depth and learning-rate studies share.
- :mod:`~vitlab.plots.analysis`: ``vitlab analyze``'s figures (collapse, residual ratios, attention maps,
  position embeddings, registers); :mod:`~vitlab.plots.probes`: the per-layer probes and artifact tokens.
- :mod:`~vitlab.plots.depth`, :mod:`~vitlab.plots.lr`, :mod:`~vitlab.plots.study` (sweep, comparison,
  complexity), :mod:`~vitlab.plots.search` (an Optuna search): each study's figures.
- :mod:`~vitlab.plots.confusion`: ``vitlab eval``'s confusion matrix.
"""
