"""smearcli as a release's Python runs it, for tests/census/test_scan_releases.py: no torch, no
census. `python tests/release_standin.py scan ...` is run by the venv made for a stand-in
transformers wheel (`wheel` below builds one): it appends what it imports and what it was asked to
$STANDIN_SEEN, and for `--only NAME --out FILE` writes NAME's record with the verdict that release
declares (its `VERDICTS`), or refuses, as the census does, a name the release does not register.
"""

from __future__ import annotations

import json
import os
import sys
import zipfile
from pathlib import Path

STANDIN_TYPE = "toyarch"


def wheel(directory: Path, version: str, verdict, requires=(), name: str = "transformers") -> Path:
    """A wheel of a stand-in `name` (transformers) at `version` whose causal-LM mapping holds
    STANDIN_TYPE with `verdict` (None: the release does not register it)."""
    registered = {} if verdict is None else {STANDIN_TYPE: "ToyForCausalLM"}
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\nVERDICTS = {{{STANDIN_TYPE!r}: {verdict!r}}}\n",
        f"{name}/models/__init__.py": "",
        f"{name}/models/auto/__init__.py": "",
        f"{name}/models/auto/modeling_auto.py": f"MODEL_FOR_CAUSAL_LM_MAPPING_NAMES = {registered!r}\n",
    }
    info = f"{name}-{version}.dist-info"
    files[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nRequires-Python: >=3.8\n"
                                 + "".join(f"Requires-Dist: {r}\n" for r in requires))
    files[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: smearcli-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{info}/RECORD"] = "".join(f"{p},,\n" for p in files) + f"{info}/RECORD,,\n"
    path = Path(directory) / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, text in files.items():
            z.writestr(p, text)
    return path


def main(argv: list) -> int:
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as names

    seen = os.environ.get("STANDIN_SEEN")
    if seen:
        with open(seen, "a") as f:
            f.write(json.dumps({"version": transformers.__version__, "argv": argv,
                                "python": sys.executable}) + "\n")
    if "--only" in argv:
        only = argv[argv.index("--only") + 1]
        if only not in names:
            sys.stderr.write(f"smearcli: error: --only: {only} is not a causal-LM model type ({len(names)} are)\n")
            return 2
        if "--out" in argv:
            from smearcli.census import record

            rec = record.new(only, transformers.VERDICTS[only], transformers_version=transformers.__version__)
            Path(argv[argv.index("--out") + 1]).write_text(json.dumps(rec.to_json()) + "\n")
    return int(os.environ.get("STANDIN_STATUS", "0"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
