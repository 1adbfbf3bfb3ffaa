"""Serving: requests streamed through pipeline stages, prefill then decode, with a paged KV
cache and a batch scheduler per replica.

- ``trace``: the workload (``Trace``), its CSV file and synthetic arrivals and lengths
- ``config``: a deployment and its scheduler (``ServeConfig``)
- ``deployment``: a config on a model and cluster -> per-stage iteration costs and KV capacity
- ``queues``: the run's request and instance tables, each instance's queues as linked lists
- ``kv_cache``: the paged block manager
- ``schedulers``: static, Orca, vLLM, Sarathi-Serve batch selection
- ``engine``: the discrete-event run of a trace -> ``ServeRun`` (``records``)
- ``results``: TTFT, TBT, end-to-end latency, throughput, SLO attainment, goodput
- ``capacity``: the highest rate that meets the SLOs
- ``timeline``: a run's window as a ``Timeline`` (one op per iteration and stage group, the
  ``SERVING_RULES`` kinds P, D, M), which every view draws (``pipesched.render.serving`` adds
  the request-level plots and the serving page)
- ``pool``, ``placement``, ``pool_search``, ``pool_result``: several models on one device pool:
  the deployment file (``PoolSpec``), placements under memory (greedy against the engine,
  dedicated, round-robin), one run with shared devices and weight swaps, read per model
"""
