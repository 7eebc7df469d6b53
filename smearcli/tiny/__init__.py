"""The tiny models every engine's census checks: one small config per causal-LM architecture of the
installed transformers, derived from its config class's defaults, and one per layer order.

- `derive` shrinks a config class's defaults to a tiny config (width, layers, heads, vocabulary,
  windows and blocks below the census's step widths), builds the seeded model, and reads the head
  and expert counts back to the defaults for a finding's replication;
- `layers` finds how a config spells its layers and makes its layer orders (each kind as layer 0).

Every engine takes its models from here (transformers' check, and vLLM's and llama.cpp's sessions,
which load the same tiny model's weights); nothing here runs a cache or says a verdict.
"""
