"""`smearcli scan`: every causal-LM architecture the installed transformers registers, checked
the way `compare --impl hf` checks one (the work is `smearcli.impls.scan`)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from ...errors import UserError
from ..errors import CheckFailed, guarded


def parse_shard(text: Optional[str]) -> Optional[tuple[int, int]]:
    if text is None:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise UserError(f"--shard takes i/n (like 2/4), got {text!r}") from None
    if n < 1 or not 1 <= i <= n:
        raise UserError(f"--shard {text}: i must be between 1 and n")
    return i, n


def meta() -> dict:
    import platform

    import torch
    import transformers

    return {"transformers_version": transformers.__version__, "torch_version": torch.__version__,
            "python": platform.python_version()}


@guarded
def scan(
    out: Annotated[Path, typer.Option("--out", help="The JSON Lines file each architecture's record "
                   "is appended to as it finishes.")] = Path("scan.jsonl"),
    jobs: Annotated[int, typer.Option("--jobs", help="Architectures checked at once, one process each.")] = 1,
    shard: Annotated[Optional[str], typer.Option("--shard", help="i/n: check only the i-th of n shares "
                     "of the list (a CI matrix); merge the files with --merge.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Skip the architectures --out already holds.")] = False,
    only: Annotated[Optional[str], typer.Option("--only", help="Comma-separated model types to check "
                    "(default: every causal LM in the auto mapping).")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds one architecture may take.")] = 240.0,
    memory_mb: Annotated[int, typer.Option("--memory-mb", help="Address space one architecture's process "
                         "may use, in MiB.")] = 3072,
    repro_dir: Annotated[Path, typer.Option("--repro-dir", help="Where each finding's standalone "
                         "reproducer is written (and run).")] = Path("scan-repro"),
    merge: Annotated[Optional[list[Path]], typer.Option("--merge", help="Check nothing: report the "
                     "records of these scan files (shards) as one.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the smearcli.scan/1 document "
                        "instead of the table.")] = False,
    markdown: Annotated[Optional[Path], typer.Option("--markdown", help="Also write the census as "
                        "Markdown to this file.")] = None,
    figure: Annotated[Optional[Path], typer.Option("--figure", help="Also draw architectures x "
                      "schedules (error over the floor) to this .png, .svg or .pdf.")] = None,
    check: Annotated[bool, typer.Option("--check", help="Exit 1 if any architecture is a bug.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No line per architecture on stderr.")] = False,
) -> None:
    """Check every causal-LM architecture of the installed transformers: a tiny config derived
    from each config class's defaults, the full pass against fuzzed cached schedules and the padded
    and rollback boundaries over a float64 noise floor, the carried state shown to matter before an ok, the error's shape named, and a
    standalone reproducer per finding. Each architecture runs in its own process with --timeout
    and --memory-mb; records stream to --out. Try: smearcli scan --only bamba,llama."""
    from ...impls.scan import report
    from ...impls.scan import isolate

    if jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {jobs}")
    if not timeout > 0:
        raise UserError(f"--timeout must be a positive number of seconds, got {timeout}")
    if memory_mb < 64:
        raise UserError(f"--memory-mb must be at least 64, got {memory_mb}")
    part = parse_shard(shard)
    if figure is not None:
        from ...files import check_output_path

        check_output_path(figure, (".png", ".svg", ".pdf"))
    t0 = time.monotonic()
    if merge:
        records = isolate.merge(merge)
    else:
        records = _run(out, jobs, part, resume, only, timeout, memory_mb, repro_dir, quiet)
    info = meta() | {"wall_s": round(time.monotonic() - t0, 1)}
    if json_out:
        sys.stdout.write(json.dumps(report.document(records, info), indent=1, default=str) + "\n")
    else:
        sys.stdout.write(report.table(records) + "\n")
    if markdown is not None:
        markdown.write_text(report.markdown(records, info))
    if figure is not None and any(r.get("schedules") for r in records):
        from ...render import figures, scan_figure

        figures.save(scan_figure.figure(records), figure)
    bugs = [r["model_type"] for r in records if r.get("verdict") == "bug"]
    if check and bugs:
        raise CheckFailed(f"{len(bugs)} architectures disagree with their full pass: {', '.join(bugs)}")


def _run(out, jobs, part, resume, only, timeout, memory_mb, repro_dir, quiet):
    import functools

    from ...impls.scan import check as chk
    from ...impls.scan import isolate

    names = isolate.causal_lm_types()
    if only:
        wanted = [n.strip() for n in only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            raise UserError(f"--only: {', '.join(unknown)} is not a causal LM of this transformers")
        names = wanted
    if part is not None:
        names = isolate.shard(names, *part)

    def said(rec):
        if not quiet:
            sys.stderr.write(f"smearcli: {rec['model_type']}: {rec['verdict']}"
                             f"{' (' + str(rec.get('wall_s')) + ' s)' if rec.get('wall_s') else ''}\n")
    isolate.scan(names, functools.partial(chk.check, repro_dir=repro_dir.resolve()), out, jobs=jobs,
                 timeout=timeout, memory=memory_mb << 20, resume=resume, on_record=said)
    return isolate.merge([out])
