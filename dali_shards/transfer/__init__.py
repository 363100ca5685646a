"""How the workers' mini-batches reach DALI: the two transfers.

- ``"ring"`` (``transfer/ring/``, the default): the library starts its own worker processes; each
  writes its mini-batch of every step into a ring of shared-memory slots, and one (non-parallel)
  external source in the main process hands DALI the step's ``batch_size`` samples, field by field,
  as views of those slots. Cost per step: ``batch_size`` slots, whatever the number of workers.
- ``"merge"`` (``transfer/merge/``): DALI's own worker pool, one parallel external source per
  worker, each emitting a full-size batch that is empty but for its own slice, merged with
  conditional execution (the workaround of DALI issue 4892). Cost per step: ``py_num_workers x
  batch_size`` slots.

Both run the same worker sources (``worker/sources.py``: the plan, reading, ``map``, bucketing,
the streaming mode) and the same run logic in the main process (epochs, cuts, state, audit,
supervision); ``transfer/base.py`` says what each transfer decides (``Handover``), and
``transfer/choice.py`` makes the pipeline's from ``options.transfer``, the one place it is read.
"""
