"""The census pages of the engines that need their own environment (vLLM, llama.cpp): the census's
Markdown, made by `smearcli scan --merge` of the records, goes between two markers of a guide.
Shared by scripts/gen_vllm_census.py and scripts/gen_llamacpp_census.py."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_block(guide: Path, start: str, end: str, records: list[Path], banner: str, who: str) -> None:
    """Replace what is between `start` and `end` in `guide` with `banner` (in italics; none when
    empty) and the Markdown of `records`, its sections one level under the guide's own heading."""
    merge = [a for r in records for a in ("--merge", str(r))]
    with tempfile.TemporaryDirectory() as d:
        md = Path(d) / "census.md"
        subprocess.run([sys.executable, "-m", "smearcli", "scan", *merge, "--markdown", str(md)],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        body = md.read_text().split("\n", 1)[1].replace("\n## ", "\n#### ")
    head, rest = guide.read_text().split(start, 1)
    _, tail = rest.split(end, 1)
    block = f"{start}\n\n" + (f"_{banner}_\n" if banner else "") + f"{body}\n{end}"
    guide.write_text(head + block + tail)
    print(f"{who}: {guide.relative_to(ROOT)} updated", flush=True)
