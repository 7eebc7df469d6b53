"""`smearcli scan`: a census of every causal-LM architecture the installed transformers registers.

`derive` makes each tiny config from the config class's defaults, `check` runs one architecture
(floor from float64, fuzzed split points, live state, the error's shape), `isolate` runs each in
its own process with limits and streams JSON Lines, `report` draws the table, the JSON document
and the Markdown report, and `repro` writes a standalone reproducer per finding.
"""
