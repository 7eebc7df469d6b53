"""`smearcli scan --engine vllm`: the census on vLLM (`smearcli.census.vllm_census`) from the
options: vLLM's interpreter (`--vllm-python`, else $SMEARCLI_VLLM_PYTHON) checked by its
handshake, one worker started for the whole run, the records streamed to `--out`, and the
benchmark (wall time, the shares importing vLLM and starting engines) on stderr and in the
run's meta. Imported only when `--engine vllm` runs.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Optional

from ..errors import UserError
from .record_file import written


def python_of(given: Optional[Path]) -> tuple[str, str]:
    """(vLLM's interpreter, the option or variable it came from)."""
    from ..impls.vllm import ENV_PYTHON

    if given is not None:
        return str(given), "--vllm-python"
    env = os.environ.get(ENV_PYTHON, "").strip()
    if env:
        return env, f"${ENV_PYTHON}"
    raise UserError(f"--engine vllm needs --vllm-python PATH (or ${ENV_PYTHON}): the Python of an environment "
                    "with vLLM; scripts/make_vllm_env.sh DIR makes one (then DIR/bin/python)")


def names_for(worker, wanted, part) -> list[str]:
    """The model types this run checks: vLLM's architectures with a transformers causal-LM class,
    then --only's, then one --shard of them."""
    from ..census import isolate, vllm_census

    names = vllm_census.names_for(worker)
    if wanted is not None:
        unknown = [n for n in wanted if n not in names]
        if unknown:
            raise UserError(f"--only: {', '.join(unknown)} is not an architecture both the installed vLLM and "
                            f"transformers register as a causal LM ({len(names)} are)")
        names = list(wanted)
    if part is not None:
        share = isolate.shard(names, *part)
        if not share:
            raise UserError(f"--shard {part[0]}/{part[1]}: {len(names)} architectures make fewer than {part[0]} "
                            "shares, so this one would check none")
        names = share
    return names


def run_vllm(out: Path, part, resume: bool, wanted, timeout: float, memory_mb: int, repro_dir: Path, quiet: bool,
             vllm_python: Optional[Path], check_repro_files) -> tuple[list, dict]:
    """(every record --out holds, the run's meta: vLLM's version and the benchmark);
    `check_repro_files(repro_dir, names)` refuses reproducer paths that cannot be written."""
    from ..census import vllm_census
    from ..impls.vllm import check_python
    from .build import flag

    python, given_as = python_of(vllm_python)
    with flag(given_as):  # a bad environment is exit 2, before any model
        hello = check_python(python)
    t0 = time.monotonic()
    worker, _ = vllm_census.started(python)
    try:
        names = names_for(worker, wanted, part)
        check_repro_files(repro_dir, names)

        done = {}

        def run(sink, said):
            done["n"] = vllm_census.run(worker, names, sink, timeout, memory_mb << 20, repro_dir.resolve(), said)
        recs = written(out, resume, quiet, run)
    finally:
        worker.close()
    bench = vllm_census.summary(done["n"], worker, time.monotonic() - t0)
    if not quiet:
        sys.stderr.write("smearcli: " + vllm_census.summary_line(bench) + "\n")
    return recs, {"engine": "vllm", "vllm_version": hello.get("vllm"), "vllm_python": python, "benchmark": bench}
