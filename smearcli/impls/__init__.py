"""What every engine that runs in its own Python shares (`impls.foreign`: the handshake, capped
reads, the worker's environment), behind `smearcli.measure.runner.Runner` like the engines themselves.

transformers, vLLM, llama.cpp and a user's nanochat checkout are engines with a folder each
(`smearcli.engines`). Our own GPT's runners are core (`smearcli.gpt.gpt_runners`). `smearcli.measure.compare`
measures any runner the same way, and the CLI reaches each through its registry (`smearcli.engines.registry`).
"""
