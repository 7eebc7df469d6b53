"""The tests' check of smearcli's JSON against its schema files (docs/schemas/*.json, JSON Schema
2020-12, read with `jsonschema`): a document names its schema (`"schema": "smearcli.compare/1"`
is docs/schemas/compare-1.json), a scan record (a line of the scan's JSON Lines output) is
`scan-1.json#/$defs/record`. Used by the autouse fixture in conftest.py, so every document a test
makes smearcli write is checked, and by tests/docs/test_schemas.py."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import jsonschema
import referencing
from referencing.jsonschema import DRAFT202012

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "docs" / "schemas"
PREFIX = "smearcli."
ELIDED = "..."  # an excerpt in the docs leaves fields out as "...": "..." and list items as "..."


def schema_file(name: str) -> Path:
    """"smearcli.compare/1" -> docs/schemas/compare-1.json."""
    return SCHEMA_DIR / (name.removeprefix(PREFIX).replace("/", "-") + ".json")


@lru_cache(maxsize=None)
def registry() -> referencing.Registry:
    """Every schema file under its `$id` (its file name), so one can refer to another."""
    files = sorted(SCHEMA_DIR.glob("*.json"))
    return referencing.Registry().with_resources(
        (p.name, DRAFT202012.create_resource(json.loads(p.read_text()))) for p in files)


@lru_cache(maxsize=None)
def validator(ref: str) -> jsonschema.Draft202012Validator:
    """A validator of `ref`, a schema file name with an optional `#/$defs/...` fragment."""
    return jsonschema.Draft202012Validator({"$ref": ref}, registry=registry())


def _messages(errors) -> list[str]:
    return [f"/{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in errors]


def document_problems(doc, excerpt: bool = False) -> list[str]:
    """What is wrong with a JSON document by its schema file; [] when it matches. A `schema` that
    is not smearcli's is none of ours (nothing to check). With `excerpt`, fields left out ("...")
    are not missing: the rest must still match."""
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith(PREFIX):
        return []
    name = doc["schema"]
    path = schema_file(name)
    if not path.is_file():
        return [f"{name}: no schema file {path.relative_to(SCHEMA_DIR.parents[1])}"]
    if excerpt:
        doc = without_elisions(doc)
    errors = validator(path.name).iter_errors(doc)
    if excerpt:
        errors = (e for e in errors if e.validator != "required")
    return [f"{name} {m}" for m in _messages(errors)]


def record_problems(rec) -> list[str]:
    """What is wrong with one scan record (a line of the JSON Lines output); [] when it matches."""
    return [f"scan record {m}" for m in _messages(validator("scan-1.json#/$defs/record").iter_errors(rec))]


def without_elisions(value):
    """`value` without the "...": "..." fields and "..." list items an excerpt puts for what it cut."""
    if isinstance(value, dict):
        return {k: without_elisions(v) for k, v in value.items() if k != ELIDED}
    if isinstance(value, list):
        return [without_elisions(v) for v in value if v != ELIDED]
    return value
