"""The padded and rollback boundaries under the scan, and how the scan measures any run (issue 23).

Besides its step plans, the scan runs two of the project's own schedules on each architecture,
through `schedules.run_schedule` on the scan's runner (the one step loop; `smearcli.boundaries`
holds their logic):

- `padded`: the row beside a shorter prefix right- and left-padded in one batch, with the
  attention mask (and `position_ids` counting the real tokens, where the forward takes them). A
  model whose forward takes no `attention_mask` is not run, and says so.
- `rollback`: a prefill, then drafts of `DRAFT` tokens whose last `REJECT` are wrong; the cache is
  cropped back with the model's own `crop` where it can be (`hf_runner.croppable`: a crop and
  attention keys and values only), else restored from a copy taken before the draft. A crop their
  API refuses falls back to the copy, with a note. A runner that can neither crop nor copy is
  reported as such (`schedules.missing`), never skipped in silence.

Both are measured against the same float32 full pass and float64 floor as every other schedule.
Each gets an entry in the record's `boundaries` (`entry`): its status (`bug`, `crashed` with the
frame in transformers, `not run` with why, or once the architecture's verdict is known `ok` /
`inconclusive` / `passed`: a pass is only `ok` when the carried state was shown to matter), the
numbers, the rollback's mode and, for a failure, the boundary's own shape (its `Schedule.shape`).
Any other boundary registered with `census=True` (`schedules.census_schedules`) runs after these
two on the same runner and gets an entry of its own (`run_others`).
A step plan's failure heads the record before a boundary's (`beside`): the boundaries run cached
steps too, and may fail with that plan's error.
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import Optional

from ..boundaries import rollback_mode
from ..metrics import RunMetrics, measure
from ..names import NOISE_MARGIN
from ..schedules import ScheduleOptions, census_schedules, missing, run_schedule, runnable, shape
from ..verdicts import BUG, CRASHED, INCONCLUSIVE, NOT_RUN, OK
from ..impls.hf import cache_runner as hf_runner
from .shapes import LEFT_UNSUPPORTED

PADDED_ROWS = ("the row", "right-padded", "left-padded")  # the padded batch's rows (one input row)
PASSED = "passed"  # a boundary that agreed, before the architecture's verdict is known (`settle`)
OWN_HANDLING = ("padded", "rollback")  # the boundaries `run_boundaries` sets up by hand


def __getattr__(name: str):
    # `SCHEDULES`: the boundaries the scan runs, read from the registry when asked (a boundary
    # registered after this module was imported is among them)
    if name == "SCHEDULES":
        return census_schedules()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def short_path(filename: str) -> str:
    """A frame's file from the package on: "transformers/models/x/modeling_x.py", "smearcli/..."."""
    path = filename.replace("\\", "/")
    for root in ("/site-packages/", "/smearcli/"):
        if root in path:
            rest = path.rsplit(root, 1)[1]
            return rest if root == "/site-packages/" else "smearcli/" + rest
    return path


def transformers_frame(exc: BaseException) -> str:
    """"transformers/models/x/modeling_x.py:123 in fn: Error: message" for the deepest frame in
    transformers (the deepest frame at all when none is)."""
    frames = traceback.extract_tb(exc.__traceback__)
    theirs = [f for f in frames if "/transformers/" in f.filename.replace("\\", "/")]
    f = (theirs or frames or [None])[-1]
    where = "?" if f is None else f"{short_path(f.filename)}:{f.lineno} in {f.name}"
    return f"{where}: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def logits_only(ref):
    return dataclasses.replace(ref, hiddens=None)


def logits_noise(noise):
    return dataclasses.replace(noise, per_layer=noise.per_layer[-1:])


def measured(ref, run, noise, tolerance: float = NOISE_MARGIN) -> RunMetrics:
    """`run` against the reference: every capture point when both have them, the logits otherwise."""
    if run.hiddens is not None and ref.hiddens is not None and len(run.hiddens) == len(ref.hiddens):
        return measure(ref, run, noise, tolerance)
    return measure(logits_only(ref), dataclasses.replace(run, hiddens=None), logits_noise(noise), tolerance)


def entry(status: str, **kw) -> dict:
    out = {"status": status, "max_abs": None, "multiple": None, "shape": None, "mode": None, "why": None}
    # padded adds pad_id, positions (explicit position_ids or not) and rows (max |dlogit| per row)
    out.update(kw)
    return out


def run_one(runner, tokens, name: str, ref, noise, tolerance, opts=ScheduleOptions()):
    """(metrics or None, the run or None, its entry) of one boundary schedule on `runner`."""
    if not runnable(runner, name):
        return None, None, entry(NOT_RUN, why=f"{runner.label} cannot run it: {missing(runner, name)}")
    try:
        run = run_schedule(runner, tokens, name, opts=opts, capture=ref.hiddens is not None)
    except hf_runner.CropRefused:
        raise
    except Exception as e:
        return None, None, entry(CRASHED, why=transformers_frame(e))
    m = measured(ref, run, noise, tolerance)
    return m, run, entry(PASSED if m.passed else BUG, max_abs=m.max_abs_logits, multiple=m.logits_multiple,
                         shape=None if m.passed else shape(name))


def run_boundaries(model, make, layers, tokens, ref, noise, tolerance: float = NOISE_MARGIN):
    """(name -> metrics, name -> entry, name -> steps, notes, name -> the runner it ran on) of
    padded and rollback on `model`; `make(model, layers, crop=...)` builds the scan's runner."""
    ms, entries, steps, notes, used = {}, {}, {}, [], {}
    runner = make(model, layers)
    if runner.can("padding") and not getattr(runner, "takes_mask", True):
        entries["padded"] = entry(NOT_RUN, why=f"{type(model).__name__}.forward takes no attention_mask")
    else:
        said = prepare_padded(runner, tokens, tolerance * noise.per_layer[-1])
        m, run, entries["padded"] = run_one(runner, tokens, "padded", ref, noise, tolerance)
        e = entries["padded"]
        e.update(pad_id=getattr(runner, "pad_id", None), positions=getattr(runner, "pad_positions", None)
                 and getattr(runner, "takes_positions", False))
        if m is not None:
            ms["padded"], steps["padded"], used["padded"] = m, run.steps, runner
            e["rows"] = dict(zip(PADDED_ROWS, (float(x) for x in (run.logits - ref.logits).abs().amax(dim=(1, 2)))))
            if e["status"] == BUG:
                thr = tolerance * noise.per_layer[-1]
                said = said + why_padded(e["rows"], thr, e["positions"])
                if left_only(e["rows"], thr) and not getattr(runner, "takes_positions", False):
                    e.update(status=LEFT_UNSUPPORTED, shape=None)
                    del ms["padded"]  # not a finding: the verdict does not read it
        e["why"] = "; ".join(filter(None, [e["why"], *said])) or None
    why_not = _why_no_crop(runner, tokens)
    rb = make(model, layers, crop=True) if why_not is None else runner
    try:
        m, run, e = run_one(rb, tokens, "rollback", ref, noise, tolerance)
    except hf_runner.CropRefused as refused:
        why_not = str(refused)
        rb = runner
        m, run, e = run_one(rb, tokens, "rollback", ref, noise, tolerance)
    e["mode"] = rollback_mode(rb)
    if e["mode"] == "copy" and why_not:
        e["why"] = e["why"] or f"restored from a copy: {why_not}"
        notes.append(f"rollback restores a copy of the cache: {why_not}")
    if e["status"] == NOT_RUN:
        notes.append(f"rollback not run: {e['why']}")
    entries["rollback"] = e
    if m is not None:
        ms["rollback"], steps["rollback"], used["rollback"] = m, run.steps, rb
        notes += [n for n in run.notes if n.startswith("rollback")]
    if entries["padded"]["status"] in (NOT_RUN, CRASHED):
        notes.append(f"padded {entries['padded']['status']}: {entries['padded']['why']}")
    run_others(runner, tokens, ref, noise, tolerance, (ms, entries, steps, notes, used))
    return ms, entries, steps, notes, used


def run_others(runner, tokens, ref, noise, tolerance, out) -> None:
    """Every other census boundary on the scan's runner, into `run_boundaries`' five dicts."""
    ms, entries, steps, notes, used = out
    for name in census_schedules():
        if name in OWN_HANDLING:
            continue
        m, run, entries[name] = run_one(runner, tokens, name, ref, noise, tolerance)
        if m is not None:
            ms[name], steps[name], used[name] = m, run.steps, runner
        elif entries[name]["status"] in (NOT_RUN, CRASHED):
            notes.append(f"{name} {entries[name]['status']}: {entries[name]['why']}")


def prepare_padded(runner, tokens, threshold: float) -> list[str]:
    """Set the scan's runner up for padded batches as the model expects them: padding holds the
    config's `pad_token_id` (where it is a token id), and explicit `position_ids` (counted from 0
    over the real tokens) are passed only where `arange(T)` gives the row alone's logits (RoBERTa
    numbers positions from its padding id on): what was changed, in words."""
    import torch

    said = []
    cfg = getattr(runner.model, "config", None)
    pad = getattr(cfg, "pad_token_id", None)
    if pad is None and cfg is not None and hasattr(cfg, "get_text_config"):
        pad = getattr(cfg.get_text_config(), "pad_token_id", None)
    if isinstance(pad, int) and 0 <= pad <= int(tokens.max()):
        runner.pad_id = pad
    if getattr(runner, "takes_positions", False):
        ids = tokens.to(runner.device)
        pos = torch.arange(ids.size(1), device=runner.device).unsqueeze(0).expand(ids.size(0), -1)
        try:
            with torch.inference_mode():
                own = runner.model(input_ids=ids, use_cache=False).logits.float()
                given = runner.model(input_ids=ids, position_ids=pos, use_cache=False).logits.float()
            off = float((own - given).abs().max())
        except Exception:
            return said
        if off > threshold:
            runner.pad_positions = False
            said.append(f"explicit position_ids counted from 0 move the row alone by {off:.2g}: the model "
                        "numbers positions its own way, so the padded batch runs without them")
    return said


def left_only(rows: dict, threshold: float) -> bool:
    """Whether only the left-padded row of a padded batch is off."""
    return [k for k, v in rows.items() if v > threshold] == ["left-padded"]


def why_padded(rows: dict, threshold: float, positions: bool) -> list[str]:
    """Which rows of a failed padded batch are off, and what that points at."""
    off = [k for k, v in rows.items() if v > threshold]
    out = [f"off: {', '.join(off)}"]
    if off == ["left-padded"] and not positions:
        out.append("the forward takes no position_ids: a left-padded row is numbered after its pads "
                   "(a recurrent state reads them); right padding passes")
    elif "the row" in off:
        out.append("the row with no padding is off too: the mask path itself differs")
    return out


def _why_no_crop(runner, tokens) -> Optional[str]:
    if not isinstance(runner, hf_runner.CacheRunner):
        return "not a transformers cache"
    try:
        return hf_runner.croppable(runner, tokens)
    except Exception as e:  # a two-token probe their code refuses: the rollback run says the rest
        return f"the cache could not be probed ({type(e).__name__})"


def settle(entries: dict, verdict: str) -> dict:
    """Entries that passed take the architecture's verdict when it is ok or inconclusive (a pass
    on state never shown to matter is no ok), and stay `passed` beside another schedule's bug."""
    for e in entries.values():
        if e["status"] == PASSED and verdict in (OK, INCONCLUSIVE):
            e["status"] = verdict
    return entries


def beside(entries: dict, worst: str) -> dict:
    """A failed boundary beside a failing step plan says it may be that plan's error: its cached
    steps may fail without any padding or rollback."""
    for e in entries.values():
        if e["status"] == BUG:
            e["why"] = "; ".join(filter(None, [e["why"], f"{worst!r} fails too, without this boundary"]))
    return entries
