"""What a vLLM census record keeps of vLLM's side (`Record.vllm`), as a typed part of the record
(`census.record.Part`); registered with the engine (`Engine.data`), so a record read back holds one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ...census.record import BOOLEAN, INTEGER, LIST, NUMBER, Part, part_field


@dataclass(eq=False)
class VllmData(Part):
    """Whether the worker answered, how long vLLM took to start each engine and to run the request,
    the worker's peak memory, whether a request stuck inside vLLM, and the imports and worker starts
    the census had made by then (its benchmark, should it stop early)."""

    AS_GIVEN = True

    answered: Optional[bool] = part_field(BOOLEAN)
    engine_start_s: Optional[list] = part_field(LIST)
    total_s: Optional[float] = part_field(NUMBER)
    peak_rss_mb: Optional[float] = part_field(NUMBER)
    stuck: Optional[bool] = part_field(BOOLEAN)
    import_s_so_far: Optional[float] = part_field(NUMBER)
    starts: Optional[int] = part_field(INTEGER)
    extra: dict = field(default_factory=dict)
