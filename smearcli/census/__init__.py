"""`smearcli scan`: a census of every causal-LM architecture an engine runs (transformers' own caches
by default, vLLM with `--engine vllm`, llama.cpp with `--engine llamacpp`). This package is the core
every engine shares; what one engine alone needs lives in its folder (`smearcli.engines.NAME`:
transformers' check of one architecture, its boundaries, where an error is born, ties, root-cause
groups, generate's paths, reproducers and drafts, its page, what its sources say of a change
between releases; each engine's census session). A failure's shape (`smearcli.measure.shapes`) and a
top-k's exact ties (`smearcli.measure.topk`) are measurements any run has, not the census's.

- the tiny models it checks are `smearcli.tiny`'s (one config per architecture and layer order),
  not the census's own: every engine takes them from there;
- `record` declares a record's fields once (`Record`, and each part of it: `ScheduleResult`,
  `BoundaryResult`, `BornIn`, `ConfirmationEntry`, ...; an engine's own fields, its release and its
  data, its folder declares and its registration adds, `record.hold`): the object every engine's
  check returns and every reader takes; `records` reads and
  writes the record files (JSON only there and on a worker's pipe);
- `isolate` runs each architecture in its own process with limits and streams JSON Lines (each
  record stamped with the releases its session names), `budget` says what happens when time runs
  out (a retry, then `timed out`; a verdict already made kept);
- `engines` is the registry of the engines a census runs on (`scan --engine`; each engine's session
  named there as a string), `isolate.census` the one loop they all run through;
- `report` draws the table, the JSON document and the Markdown page's frame (the engine gives its
  sections);
- `known` places each finding against what upstream knows (`known.toml`), `diff` compares two
  censuses (the engine's sources, where given, say why a result moved); transformers'
  `engines.transformers.releases` runs one on another of its releases (`--release`, `--bisect`).
"""
