"""The vLLM engine: vLLM's scheduler and caches, in vLLM's own environment, through a subprocess.

Its runner (`VLLMRunner`, `Settings`, ...) is `implementation`'s, the names lent by the package on
first use, so that its torch-free modules (`registration`, `environment`) import alone; `worker`
runs in vLLM's environment, `serve` keeps one worker for a census, `session` is its census and
`prepare` its command-line preparation.
"""

from __future__ import annotations

from ...util.named import lend

__getattr__, __dir__ = lend(globals())
