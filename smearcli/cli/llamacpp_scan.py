"""`smearcli scan --engine llamacpp`: the census on llama.cpp (`smearcli.census.llamacpp`) from the
options: llama.cpp's interpreter (`--llamacpp-python`, else $SMEARCLI_LLAMACPP_PYTHON) checked by
its handshake, the converter's architectures listed there, each architecture in its own process
(`--jobs` at once, `--timeout` each) with its own llama.cpp worker, the records streamed to
`--out`, and the benchmark (conversion, load, runs) on stderr and in the run's meta. Imported only
when `--engine llamacpp` runs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

from ..errors import UserError
from .record_file import written


def python_of(given: Optional[Path]) -> tuple[str, str]:
    """(llama.cpp's interpreter, the option or variable it came from)."""
    from ..impls.llamacpp import ENV_PYTHON

    if given is not None:
        return str(given), "--llamacpp-python"
    env = os.environ.get(ENV_PYTHON, "").strip()
    if env:
        return env, f"${ENV_PYTHON}"
    raise UserError(f"--engine llamacpp needs --llamacpp-python PATH (or ${ENV_PYTHON}): the Python of an "
                    "environment with llama-cpp-python; scripts/make_llamacpp_env.sh DIR makes one (then DIR/bin/python)")


def names_for(names: list, wanted, part) -> list[str]:
    """The model types this run checks: of `names` (the converter's architectures with a
    transformers causal-LM class), --only's, then one --shard of them."""
    from ..census import isolate

    if wanted is not None:
        unknown = [n for n in wanted if n not in names]
        if unknown:
            raise UserError(f"--only: {', '.join(unknown)} is not an architecture both llama.cpp's converter and "
                            f"transformers register as a causal LM ({len(names)} are)")
        names = list(wanted)
    if part is not None:
        share = isolate.shard(names, *part)
        if not share:
            raise UserError(f"--shard {part[0]}/{part[1]}: {len(names)} architectures make fewer than {part[0]} "
                            "shares, so this one would check none")
        names = share
    return names


def run_llamacpp(out: Path, jobs: int, part, resume: bool, wanted, timeout: float, memory_mb: int, repro_dir: Path,
                 quiet: bool, llamacpp_python: Optional[Path], check_repro_files) -> tuple[list, dict]:
    """(every record --out holds, the run's meta: llama-cpp-python's version and the benchmark);
    `check_repro_files(repro_dir, names)` refuses reproducer paths that cannot be written."""
    from ..census import isolate, llamacpp
    from .build import flag

    python, given_as = python_of(llamacpp_python)
    with flag(given_as):  # a bad environment is exit 2, before any model
        session = llamacpp.open_session(python, quiet)
    try:
        names = names_for(session.model_types(), wanted, part)
        check_repro_files(repro_dir, names)

        def run(sink, said):
            isolate.census(session, names, sink, jobs, timeout, memory_mb << 20, repro_dir, said)
        recs = written(out, resume, quiet, run)
        info = session.meta()
    finally:
        session.close()
    if not quiet:
        sys.stderr.write(f"smearcli: {llamacpp.summary_line(info['benchmark'])} (--jobs {jobs}, load {info['load']})\n")
    return recs, {**info, "jobs": jobs}
