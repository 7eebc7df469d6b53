"""`smearcli scan`: a census of every causal-LM architecture the installed transformers registers,
and of every one the installed vLLM runs (`--engine vllm`) or llama.cpp's converter registers
(`--engine llamacpp`).

- `derive` makes each tiny config from the config class's defaults, and `variants` one per layer
  kind with that kind as layer 0;
- `check` runs one architecture (the float64 floor, fuzzed split points, power before ok, every
  departure confirmed in float64, the error's shape), `boundary` its padded and rollback runs
  (rollback through transformers' own cache API beside a copy), `born` the module an error is
  born in, `shapes` names the failure;
- `record` declares a record's fields once (`Record`, and `BoundaryResult` for each boundary's
  entry): the object every engine's check returns and every reader takes; `records` reads and
  writes the record files (JSON only there and on a worker's pipe),
  `isolate` runs each architecture in its own process with limits and streams JSON Lines, `budget`
  says what happens when time runs out (a retry, then `timed out`; a verdict already made kept);
- `report` draws the table, the JSON document and the Markdown census, `groups` puts findings
  with one root cause together (and findings about an API, once), `repro` and `draft` write a
  standalone reproducer and a bug-report draft per finding, `findings_files` in an order that
  never leaves a file without its record;
- `engines` is the registry of the engines a census runs on (`scan --engine`), `isolate.census` the
  one loop they all run through;
- the vLLM and llama.cpp engines' sessions live in their own folders (`smearcli.engines.vllm.session`,
  `smearcli.engines.llamacpp.session`), registered here by name;
- `reference`: what both engines are held to, transformers' full pass of the same tiny model (the
  model types an engine's architecture names map to, the saved model, the init ladder with power
  first); neither engine imports the other.
"""
