"""The transformers engine's census session (`scan --engine transformers`, the default): what its
`registration` names for `census.engines` to open. It runs in smearcli's own process, over every
causal LM the installed transformers registers, one architecture checked by `check.check`."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional

from ...census.record import Record
from ...util.errors import UserError


class InProcess:
    """The transformers engine's session: in smearcli's own process, every causal LM of the
    installed transformers (`tiny.derive.causal_lm_types`), checked by `check.check`, architectures at
    once as `--jobs` allows; nothing to start, restart or close."""

    def __init__(self, python: Optional[str] = None, quiet: bool = False):
        if python is not None:
            raise UserError("the transformers engine runs in smearcli's own Python: it takes no engine Python")

    def meta(self) -> dict:
        return {}  # its versions are those of smearcli's own process, which every run's meta holds

    def model_types(self) -> list[str]:
        from ...tiny import derive

        return derive.causal_lm_types()

    def check(self, model_type: str, repro_dir: Path, timeout: float, memory: Optional[int]) -> Record:
        from . import check

        return check.check(model_type, repro_dir=repro_dir)

    def checked(self, record: Record, more: bool) -> bool:
        return False

    def stamp(self) -> dict:
        from .reference import stamp

        return stamp()

    @contextlib.contextmanager
    def gathering(self):
        """In a census child, around its check: the fast kernels transformers fell back without
        (`kernels.collected`, their warnings kept out of the progress lines), as a set."""
        from . import kernels

        with kernels.collected() as f:
            yield f.missing

    def gathered(self, words: set) -> str:
        """The one line a census says of every child's `gathering`."""
        from . import kernels

        return kernels.note(words)

    def close(self) -> None:
        pass
