"""The llama.cpp engine: llama.cpp through llama-cpp-python, in its own environment, through a
subprocess.

Its runner (`LlamaCppRunner`, `Settings`, ...) is `implementation`'s, the names lent by the package
on first use, so that its torch-free modules (`registration`, `environment`) import alone; `worker`
(with `worker_convert`) runs in llama.cpp's environment, `calls` and `forkserver` reach it,
`session` is its census and `prepare` its command-line preparation.
"""

from __future__ import annotations

from ...util.named import lend

__getattr__, __dir__ = lend(globals())
