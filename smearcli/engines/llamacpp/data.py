"""What a llama.cpp census record keeps of llama.cpp's side (`Record.llamacpp`), as a typed part of
the record (`census.record.Part`); registered with the engine (`Engine.data`), so a record read back
holds one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ...census.record import BOOLEAN, INTEGER, NUMBER, OBJECT, ONE, STRING, Part, Rerun, part_field


@dataclass(eq=False)
class CarriedEntry(Part):
    """A setting the tiny config took because llama.cpp hard-codes it or does not carry it
    (`session.Carried`), where llama.cpp says so, and what the config class's defaults gave when
    rerun (`default`)."""

    AS_GIVEN = True

    settings: Optional[dict] = part_field(OBJECT)
    layers: Optional[int] = part_field(INTEGER)
    where: Optional[str] = part_field(STRING)
    kind: Optional[str] = part_field(STRING)
    default: Optional[Rerun] = part_field(OBJECT)
    extra: dict = field(default_factory=dict)

    NESTED = {"default": (Rerun, ONE)}


@dataclass(eq=False)
class LlamaCppData(Part):
    """llama-cpp-python's version, the GGUF (its architecture and size), the times (conversion,
    load, the schedules, the worker), whether its memory is recurrent or hybrid, the workers that
    died, how far the float16 cache moves prefill and decode, llama.cpp's own spread, what a
    departure is (`session.CACHE`, `IMPLEMENTATION`, not replicated), exact ties seen, and a
    carried setting."""

    AS_GIVEN = True

    llama_cpp_python: Optional[str] = part_field(STRING)
    arch: Optional[str] = part_field(STRING)
    gguf_mb: Optional[float] = part_field(NUMBER)
    convert_s: Optional[float] = part_field(NUMBER)
    load_s: Optional[float] = part_field(NUMBER)
    schedules_s: Optional[float] = part_field(NUMBER)
    worker_s: Optional[float] = part_field(NUMBER)
    wall_s: Optional[float] = part_field(NUMBER)
    recurrent: Optional[bool] = part_field(BOOLEAN)
    hybrid: Optional[bool] = part_field(BOOLEAN)
    deaths: Optional[int] = part_field(INTEGER)
    f16_cache: Optional[dict] = part_field(OBJECT)  # schedule -> max |d log-prob| the float16 cache moves it
    own_spread: Optional[float] = part_field(NUMBER)
    departure: Optional[str] = part_field(STRING)
    ties: Optional[int] = part_field(INTEGER)
    carried: Optional[CarriedEntry] = part_field(OBJECT)
    extra: dict = field(default_factory=dict)

    NESTED = {"carried": (CarriedEntry, ONE)}
