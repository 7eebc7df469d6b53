"""The padded and rollback boundaries under the scan, and how the scan measures any run.

Besides its step plans, the scan runs two of the project's own schedules on each architecture,
through `schedules.run_schedule` on the scan's runner (the one step loop; `smearcli.measure.boundaries`
holds their logic):

- `padded`: the row beside a shorter prefix right- and left-padded in one batch, with the
  attention mask (and `position_ids` counting the real tokens, where the forward takes them). A
  model whose forward takes no `attention_mask` is not run, and says so.
- `rollback`: a prefill, then drafts of `DRAFT` tokens whose last `REJECT` are wrong, taken back
  twice (`run_rollback`): through their cache API as assisted generation calls it ("their crop":
  the cache generate makes, past recording on, `crop(-rejected)`, see `hf_runner`), and through a
  copy taken before each draft. Each result is in the entry (`their_crop`, `copy`), each failure
  confirmed in float64 lifted; the entry's top level is the headline run's (a failure first), so a
  bug of their crop is the architecture's bug like any boundary's. Their API missing (no crop, no
  recording) or refusing in so many words (`frames.declared_limit`) is `refused`, not a bug; any
  other exception inside their crop is their crash: it heads the entry (`crashed`, the frame in
  transformers) and the architecture's verdict, with the copy's result beside it, never instead
  of it. `generate_refuses` says why `generate()` itself refuses assisted decoding for the model,
  where the installed release declares it. A runner that can neither crop nor copy is reported as
  such (`schedules.missing`), never skipped in silence. Where the library declares the rollback
  unsupported (`generate_refuses`), their crop that raised or agreed is `unsupported` with the
  declaration quoted; one their API accepted and that left the state wrong is the architecture's
  finding all the same, the declaration beside it, and one finding about their API at its code
  (`declared`, `api_finding`).

Both are measured against the same float32 full pass and float64 floor as every other schedule.
Each gets an entry in the record's `boundaries` (`entry`): its status (`bug`, `crashed` with the
frame in transformers, `not run` with why, or once the architecture's verdict is known `ok` /
`inconclusive` / `not judged`: a pass is only `ok` when the carried state was shown to matter, and
that is measured only when every schedule agrees), the numbers, the rollback's mode (the headline
run's: `crop` or `copy`) and, for a failure, the boundary's own shape (its `Schedule.shape`). Any
other boundary registered with `census=True` (`schedules.census_schedules`) runs after these two on
the same runner and gets an entry of its own; `run_boundaries` gives them all as one `Boundaries`.
A step plan's failure heads the record before a boundary's (`beside`): the boundaries run cached
steps too, and may fail with that plan's error.

The boundaries in combination (`boundaries.COMBINATIONS`, registered here: the census runs them,
`run_combinations`) each get an entry too, their parts' failures said beside theirs:

- `padded-chunks` and `padded-decode` run on the padded batch's runner, set up as padded is
  (`prepare_padded`), and are `not run` with why where the forward takes no `attention_mask`. Their
  `padded-chunks` is `not run` too where `generate(prefill_chunk_size=...)` refuses a chunked
  prefill in so many words (`hf_runner.chunked_prefill_refusal`: a cache of linear-attention
  layers only), and a decode step gets the mask as `generate()` hands it (`decode_mask`). Their
  entry adds `pad_ids` (the model's own, and one whose embedding is not zero) and `rows`. Left
  padding off only in its padded rows, where no `position_ids` were passed (the forward takes
  none, or numbers positions its own way), is `left padding unsupported`, as padded's; right padding off only in its padded rows is `unsupported` where the
  release's `generate()` declares right padding wrong for a decoder-only model (its warning
  quoted in `declared`), a finding where it does not.
- `rollback-window` runs on a crop runner of its own, its `window` read from the config
  (`WINDOW_KEYS`), only where the rollback's own crop is a path their API supports: where
  `generate()` refuses assisted decoding, or their crop was refused, it is `not run` with why.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ...judging import evidence, judge
from ...util import frames
from ...measure.boundaries import COMBINATIONS, pad_ids, rollback_mode
from ...measure.metrics import RunMetrics, measure
from ...util.defaults import NOISE_MARGIN
from ...measure.schedules import census_schedules, missing, register, run_schedule, runnable, shape
from ...measure.steps import ScheduleOptions
from ...judging.verdicts import (
    BUG, CRASHED, INCONCLUSIVE, NOT_JUDGED, NOT_JUDGED_WHY, NOT_RUN, OK, ROUNDING, UNCONFIRMED, UNSUPPORTED,
)
from . import cache_runner as hf_runner
from ...census.record import BoundaryResult

PADDED_ROWS = ("the row", "right-padded", "left-padded")  # the padded batch's rows (one input row)
PASSED = "passed"  # a boundary that agreed, before the architecture's verdict is known (`settle`, `beside`)
# a boundary that left the tolerance, before its float64 rerun (`confirm`, `check.confirmed`) gives
# it the judge's status: no verdict word of its own, and never in a record
DEPARTS = "departs"
REFUSED = "refused"  # rollback through their cache API: the API refused (no crop, or it raised)
for _s in COMBINATIONS:  # the census's own: registered where the census is, after the built-in schedules
    register(_s)
COMBINED = tuple(s.name for s in COMBINATIONS)  # the boundaries in combination (`run_combinations`)
OWN_HANDLING = ("padded", "rollback") + COMBINED  # the boundaries `run_boundaries` sets up by hand
# the config keys of a sliding window (the scan's split points read them too), and of chunked
# attention's chunk: what the window of `rollback-window` is read from
WINDOW_KEYS = ("sliding_window", "attention_window_size", "window_size", "sliding_window_size")
CHUNKED_ATTENTION = "attention_chunk_size"


def __getattr__(name: str):
    # `SCHEDULES`: the boundaries the scan runs, read from the registry when asked (a boundary
    # registered after this module was imported is among them)
    if name == "SCHEDULES":
        return census_schedules()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def transformers_frame(exc: BaseException) -> str:
    """"transformers/models/x/modeling_x.py:123 in fn: Error: message" for the deepest frame in
    transformers (the deepest frame at all when none is): `frames.describe`. A model whose forward
    returned no causal LM's output (`hf_runner.ModelOutputError`) is named at its forward."""
    if isinstance(exc, hf_runner.ModelOutputError):
        return f"{exc.where}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return frames.describe(exc, "transformers")


def logits_only(ref):
    return dataclasses.replace(ref, hiddens=None)


def logits_noise(noise):
    return dataclasses.replace(noise, per_layer=noise.per_layer[-1:])


def measured(ref, run, noise, tolerance: float = NOISE_MARGIN) -> RunMetrics:
    """`run` against the reference: every capture point when both have them, the logits otherwise."""
    if run.hiddens is not None and ref.hiddens is not None and len(run.hiddens) == len(ref.hiddens):
        return measure(ref, run, noise, tolerance)
    return measure(logits_only(ref), dataclasses.replace(run, hiddens=None), logits_noise(noise), tolerance)


def entry(status: str, **kw) -> BoundaryResult:
    """A boundary's entry in the record: its status, numbers, shape, mode and why (None until
    known), and what `kw` adds; padded adds pad_id, positions (explicit position_ids or not) and
    rows (max |dlogit| per row)."""
    return BoundaryResult(status, **{"max_abs": None, "multiple": None, "shape": None, "mode": None, "why": None, **kw})


def run_one(runner, tokens, name: str, ref, noise, tolerance, opts=ScheduleOptions()):
    """(metrics or None, the run or None, its entry) of one boundary schedule on `runner`."""
    if not runnable(runner, name):
        return None, None, entry(judge.unmeasured(judge.CANNOT_RUN),
                                 why=f"{runner.label} cannot run it: {missing(runner, name)}")
    try:
        run = run_schedule(runner, tokens, name, opts=opts, capture=ref.hiddens is not None)
    except hf_runner.CropRefused:
        raise
    except Exception as e:
        limit = frames.declared_limit(e, "transformers")  # a use their API refuses on purpose: not run
        if limit:
            return None, None, entry(judge.unmeasured(judge.THEIRS_REFUSES),
                                     why=f"refused by their code as a use it does not support: {limit}")
        return None, None, entry(judge.unmeasured(judge.RAISED), why=transformers_frame(e))
    m = measured(ref, run, noise, tolerance)
    # a departure's status is provisional until `check.confirmed` reruns it in float64 and sets the
    # judge's (`judge.status`: bug, unconfirmed, or passed as rounding)
    return m, run, entry(PASSED if m.passed else DEPARTS, max_abs=m.max_abs_logits, multiple=m.logits_multiple,
                         shape=None if m.passed else shape(name))


@dataclasses.dataclass
class Boundaries:
    """What the census's boundaries gave on one model (`run_boundaries`): for each boundary that was
    measured, its metrics, its steps and the runner it ran on (rollback runs on a runner of its
    own); every boundary's entry (`BoundaryResult`), measured or not; the notes for the record."""
    metrics: dict = dataclasses.field(default_factory=dict)  # name -> RunMetrics
    entries: dict = dataclasses.field(default_factory=dict)  # name -> BoundaryResult
    steps: dict = dataclasses.field(default_factory=dict)  # name -> its step sizes
    runners: dict = dataclasses.field(default_factory=dict)  # name -> the runner it ran on
    notes: list = dataclasses.field(default_factory=list)

    def measured(self, name: str, m, run, runner) -> None:
        self.metrics[name], self.steps[name], self.runners[name] = m, run.steps, runner

    def not_measured(self, name: str) -> None:
        """A boundary that did not run or raised is said in the notes; one that ran stays silent."""
        e = self.entries[name]
        if e.status in (NOT_RUN, CRASHED):
            self.notes.append(f"{name} {e.status}: {e.why}")


def run_boundaries(model, make, layers, tokens, ref, noise, tolerance: float = NOISE_MARGIN) -> Boundaries:
    """Padded, rollback and every other census boundary on `model`; `make(model, layers,
    crop=...)` builds the scan's runner."""
    out = Boundaries()
    runner = make(model, layers)
    if runner.can("padding") and not getattr(runner, "takes_mask", True):
        out.entries["padded"] = entry(judge.unmeasured(judge.CANNOT_RUN),
                                          why=f"{type(model).__name__}.forward takes no attention_mask")
    else:
        said = prepare_padded(runner, tokens, tolerance * noise.per_layer[-1])
        m, run, out.entries["padded"] = run_one(runner, tokens, "padded", ref, noise, tolerance)
        e = out.entries["padded"]
        e.pad_id = getattr(runner, "pad_id", None)
        e.positions = getattr(runner, "pad_positions", None) and getattr(runner, "takes_positions", False)
        if m is not None:
            out.measured("padded", m, run, runner)
            e.rows = dict(zip(PADDED_ROWS, (float(x) for x in (run.logits - ref.logits).abs().amax(dim=(1, 2)))))
            if e.status == DEPARTS:
                thr = tolerance * noise.per_layer[-1]
                said = said + why_padded(e.rows, thr, e.positions)
                if left_only(e.rows, thr) and not getattr(runner, "takes_positions", False):
                    e.status, e.shape = judge.unmeasured(judge.NO_PAD_POSITIONS), None
                    del out.metrics["padded"]  # not a finding: the verdict does not read it
        e.why = "; ".join(filter(None, [e.why, *said])) or None
    m, run, out.entries["rollback"], rb, said = run_rollback(model, make, layers, tokens, ref, noise, tolerance, runner)
    out.notes += said
    if m is not None:
        out.measured("rollback", m, run, rb)
    out.not_measured("padded")
    run_combinations(out, model, make, layers, tokens, ref, noise, tolerance, runner)
    for name in census_schedules():  # every other boundary, on the scan's runner
        if name in OWN_HANDLING:
            continue
        m, run, out.entries[name] = run_one(runner, tokens, name, ref, noise, tolerance)
        if m is not None:
            out.measured(name, m, run, runner)
        else:
            out.not_measured(name)
    return out


def run_combinations(out: Boundaries, model, make, layers, tokens, ref, noise, tolerance, runner) -> None:
    """The boundaries in combination into `out` (module docstring): the padded ones on the padded
    batch's runner (`prepare_padded` has run), rollback-window on a crop runner of its own."""
    thr = tolerance * noise.per_layer[-1]
    for name in ("padded-chunks", "padded-decode"):
        if not getattr(runner, "takes_mask", True):
            out.entries[name] = entry(judge.unmeasured(judge.CANNOT_RUN),
                                          why=f"{type(model).__name__}.forward takes no attention_mask")
            out.not_measured(name)
            continue
        refused = hf_runner.chunked_prefill_refusal(model) if name == "padded-chunks" else None
        if refused:  # their public API refuses the path: the cache under it is not ours to chunk
            out.entries[name] = entry(judge.unmeasured(judge.THEIRS_REFUSES),
                                      why=f"generate() refuses a chunked prefill for it: {refused}")
            out.not_measured(name)
            continue
        m, run, e = run_one(runner, tokens, name, ref, noise, tolerance)
        out.entries[name] = e
        ids = pad_ids(runner, tokens)
        e.pad_id, e.extra["pad_ids"] = ids[0], list(ids)
        e.positions = bool(getattr(runner, "pad_positions", None) and getattr(runner, "takes_positions", False))
        if m is not None:
            e.rows = dict(zip(combined_rows(name, ids), (float(x) for x in (run.logits - ref.logits).abs().amax(dim=(1, 2)))))
            if e.status == DEPARTS and not padded_limit(name, e, thr, getattr(runner, "takes_positions", False)):
                e.why = "; ".join(why_combined(name, e.rows, thr, ids, out.entries.get("padded")))
            if e.status in (DEPARTS, PASSED):  # a declared limit is not read by the verdict
                out.measured(name, m, run, runner)
        out.not_measured(name)
    m, run, e, r = run_rollback_window(model, make, layers, tokens, ref, noise, tolerance, out.entries.get("rollback"))
    out.entries["rollback-window"] = e
    if m is not None:
        out.measured("rollback-window", m, run, r)
    out.not_measured("rollback-window")


def parts_fail(entries: dict, failing_plans) -> list[str]:
    """The combinations that failed (or raised) where one of their parts fails alone, each made
    `not judged` with that part named (its error, not the combination's: the verdict does not read
    it, and it is no finding of its own; a raise keeps its frame in `why`): any failing step plan
    (each is a cached path every combination runs), `padded` for the padded ones, `rollback` for
    rollback-window. Their names."""
    out = []
    for name in COMBINED:
        e = entries.get(name)
        if e is None or e.status not in (BUG, UNCONFIRMED, CRASHED):
            continue
        own = entries.get("rollback" if name == "rollback-window" else "padded")
        part = next(iter(failing_plans), None)
        if part is None and own is not None and own.status in (BUG, UNCONFIRMED, CRASHED):
            part = "rollback" if name == "rollback-window" else "padded"
        if part is None:
            continue
        e.status, e.shape = NOT_JUDGED, None
        e.why = "; ".join(filter(None, [f"its part {part!r} fails alone: the combination's error may be that part's",
                                        e.why]))
        out.append(name)
    return out


def combined_rows(name: str, ids) -> tuple[str, str, str]:
    """The padded combinations' rows: the row, then its prefix padded with each of `ids`."""
    side = "left" if name == "padded-chunks" else "right"
    return ("the row", f"{side}-padded, pad {ids[0]}", f"{side}-padded, pad {ids[1]}")


def padded_limit(name: str, e: BoundaryResult, threshold: float, takes_positions: bool) -> bool:
    """A padded combination off only in its padded rows, on a path their API declares it does not
    number or support, made the declared status in `e` (its numbers kept, no finding): left padding
    on a forward that takes no position_ids (as padded's), right padding where generate() declares
    it wrong for a decoder-only model. Whether it was."""
    off = [k for k, v in e.rows.items() if v > threshold]
    if not off or "the row" in off:
        return False
    if name == "padded-chunks" and not e.positions:  # as padded's: the model numbers the row itself
        e.status, e.shape = judge.unmeasured(judge.NO_PAD_POSITIONS), None
        how = "numbers positions its own way" if takes_positions else "takes no position_ids"
        e.why = f"off: {', '.join(off)}; the forward {how}: a left-padded row is numbered after its pads"
        return True
    said = right_padding_declared() if name == "padded-decode" else None
    if said:
        e.status, e.shape, e.declared = str(judge.unmeasured(judge.DECLARED)), None, said
        e.why = "off: " + ", ".join(off) + "; generate() declares right padding wrong for a decoder-only model"
        return True
    return False


def right_padding_declared() -> Optional[str]:
    """The warning the installed `generate()` gives on a right-padded decoder-only batch, quoted
    ("A decoder-only architecture is being used, but right-padding was detected! ..."), or None
    where the release has none (then right padding is a path it accepts, and a departure a finding)."""
    import inspect
    import re

    try:
        from transformers.generation import utils as generation
        src = inspect.getsource(generation)
    except Exception:
        return None
    at = src.find("right-padding was detected")
    if at < 0:
        return None
    start, end = src.rfind("(", 0, at), src.find(")", at)
    words = " ".join("".join(re.findall(r'"([^"]*)"', src[start:end])).split())
    return f'"{words}"' if words else None


def why_combined(name: str, rows: dict, threshold: float, ids, padded: Optional[BoundaryResult]) -> list[str]:
    """Which rows of a failed padded combination are off, what that points at, and whether padded
    alone (one forward) fails too."""
    off = [k for k, v in rows.items() if v > threshold]
    out = [f"off: {', '.join(off)}"]
    if "the row" in off:
        out.append("the row with no padding is off too: the masked cached path itself differs")
    elif len(off) == 1:
        out.append(f"only with pad {off[0].rpartition(' ')[2]}: the padded positions' ids reach the real ones "
                   "through the cache, whatever the mask says (hidden with the other pad id)")
    if padded is not None and padded.status == DEPARTS:  # padded's own float64 rerun comes later
        out.append("padded fails too, in one forward")
    return out


def run_rollback_window(model, make, layers, tokens, ref, noise, tolerance, rollback: Optional[BoundaryResult]):
    """(metrics, run, entry, runner) of rollback-window: on a crop runner of its own, only where
    the rollback's own crop ran on a path their API supports (module docstring)."""
    crop = rollback.their_crop if rollback is not None else None
    if rollback is not None and rollback.generate_refuses:
        return None, None, entry(judge.unmeasured(judge.THEIRS_REFUSES),
                                 why=f"generate() refuses assisted decoding: {rollback.generate_refuses}"), None
    if crop is None or crop.status in (REFUSED, NOT_RUN):
        said = f"their crop {crop.status}: {crop.why}" if crop is not None else "the rollback did not run"
        return None, None, entry(judge.unmeasured(judge.CANNOT_RUN), why=said), None
    try:
        r = make(model, layers, crop=True)
    except hf_runner.CropRefused as refused:
        return None, None, entry(judge.unmeasured(judge.THEIRS_REFUSES), why=f"their crop refused: {refused}"), None
    r.window = window_of(model)
    try:
        m, run, e = run_one(r, tokens, "rollback-window", ref, noise, tolerance)
    except hf_runner.CropRefused as refused:  # their API refused the held drafts in so many words
        return None, None, entry(judge.unmeasured(judge.THEIRS_REFUSES),
                                     why=f"their crop refused held drafts: {refused}"), None
    e.mode, e.extra["window"] = "crop", r.window
    if e.status == DEPARTS and crop.status in (BUG, UNCONFIRMED, CRASHED):  # the crop's rerun already ran
        e.why = "; ".join(filter(None, [e.why, "rollback fails too, one draft per crop"]))
    return m, run, e, r


def window_of(model) -> Optional[int]:
    """The config's sliding window (or chunked attention's chunk), where it sets one above 1."""
    cfg = getattr(model, "config", None)
    for src in (cfg, getattr(cfg, "get_text_config", lambda: None)() if cfg is not None else None):
        for k in WINDOW_KEYS + (CHUNKED_ATTENTION,):
            v = getattr(src, k, None)
            if isinstance(v, int) and not isinstance(v, bool) and v > 1:
                return v
    return None


@dataclasses.dataclass
class Rolled:
    """One way of taking the drafts back (their crop, or a copy): what `run_one` gave, and its runner."""

    m: Optional[RunMetrics]
    run: object
    entry: BoundaryResult
    runner: object


def run_rollback(model, make, layers, tokens, ref, noise, tolerance, runner):
    """(metrics, run, entry, runner, notes) of the rollback boundary, taken back through their
    cache API and through a copy (module docstring). The metrics and the runner are the headline
    run's: the one the architecture's verdict reads and `check` confirms again."""
    ways = {"crop": their_crop(model, make, layers, tokens, ref, noise, tolerance),
            "copy": Rolled(*run_one(runner, tokens, "rollback", ref, noise, tolerance), runner)}
    f64 = None
    for way in ways.values():
        if way.m is not None and not way.m.passed:
            f64 = confirm(way, tokens, f64)
    refuses = generate_refuses(runner, tokens)
    declared(ways["crop"], refuses, runner, tokens)
    head = headline(ways)
    e = head.entry.but(mode=rollback_mode(head.runner) if head.runner is not None else None,
                       their_crop=result(ways["crop"]), copy=result(ways["copy"]), generate_refuses=refuses)
    said = summary(ways, e.generate_refuses)
    e.why = said or head.entry.why
    notes = [n for n in (head.run.notes if head.run is not None else ()) if n.startswith("rollback")]
    if e.status == NOT_RUN:
        notes.append(f"rollback not run: {e.why}")
    elif said:
        notes.append(f"rollback: {said}")
    return head.m, head.run, e, head.runner, notes


def their_crop(model, make, layers, tokens, ref, noise, tolerance) -> Rolled:
    """The rollback through their cache API as assisted generation calls it (`hf_runner`); the
    API refusing is a result, `refused`, with what it said."""
    try:
        r = make(model, layers, crop=True)
        return Rolled(*run_one(r, tokens, "rollback", ref, noise, tolerance), r)
    except hf_runner.CropRefused as refused:
        return Rolled(None, None, entry(REFUSED, why=str(refused)), None)


API_FINDING = "crop returns without error and leaves the state as the draft left it"


def declared(way: Rolled, refuses: Optional[str], runner, tokens) -> None:
    """Their crop on a path the library declares unsupported (`refuses`, what `generate` refuses,
    quoted, kept in `declared`). `unsupported` is for a call their API refuses: the crop raised in
    so many words (`refused`) or in their code (a crash on a declared path), or it ran and agreed.
    A crop that their API accepted, returned from without error and that left the logits off (a
    bug or unconfirmed departure) is a finding on the architecture like any boundary's, in the
    counts and in `--check`: `crop` is public, a user calls it, nothing refuses it, and the state
    it hands back is silently wrong (transformers#49036 is such a report, fixed in 5.25). The
    declaration stays beside it, and `api_finding` names the API's code that did it
    (`hf_runner.crop_site`), which the census groups across architectures (`groups.api_findings`)."""
    st = way.entry.status
    if not refuses or st in (REFUSED, NOT_RUN):
        return
    way.entry.declared = refuses
    if st in (BUG, UNCONFIRMED):
        way.entry.api_finding = {"at": hf_runner.crop_site(runner, tokens), "what": API_FINDING, "status": str(st)}
        return
    way.entry.status, way.entry.shape = str(judge.unmeasured(judge.DECLARED)), None


def confirm(way: Rolled, tokens, f64=None):
    """A failed rollback rerun in float64 lifted (`evidence.Confirmer`), as `check` confirms every
    finding: its entry becomes `bug`, `unconfirmed`, or passed (float32 rounding). Returns the
    float64 full pass, shared by both ways (it uses no cache, so the way cannot change it)."""
    f64 = evidence.Float64(way.runner, tokens, capture=False) if f64 is None else f64.sibling(way.runner)
    rerun = lambda t: run_schedule(t, tokens, "rollback", capture=False)  # noqa: E731
    c = evidence.Confirmer(way.runner, tokens, f64)(rerun, way.m.max_abs_logits)
    way.entry.confirmation = c.to_json()
    status = judge.status(judge.Run("rollback", False, c))
    if status == ROUNDING:
        way.entry.status, way.entry.shape, way.entry.why = PASSED, None, c.why
    else:  # bug or unconfirmed
        way.entry.status = str(status)
    return f64


def headline(ways: dict) -> Rolled:
    """The run the verdict reads: a confirmed failure, else an unconfirmed one, else a way that
    crashed, their crop first each time (the API users call; where both ways fail alike they
    measure one error, and the larger of two equal sizes is rounding: on another CPU the other way
    headed), else their crop where it ran, else the copy; a way the library declares unsupported
    (`declared`) is never the headline: it is reported beside it."""
    for status in (BUG, UNCONFIRMED):
        failed = [w for w in ways.values() if w.entry.status == status]
        if failed:
            return failed[0]  # `ways` holds their crop first
    crashed = [w for w in ways.values() if w.entry.status == CRASHED]
    if crashed:
        return crashed[0]
    judged = [w for w in ways.values() if w.m is not None and w.entry.status != UNSUPPORTED]
    return judged[0] if judged else ways["copy"]  # a path declared unsupported never heads


def crash(entries: dict) -> Optional[tuple[str, str]]:
    """(boundary, frame) of the first boundary whose cached run raised in their code (`crashed`),
    or None: a raise on a cached path is the architecture's result like a step plan's."""
    return next(((name, e.why or "") for name, e in entries.items() if e.status == CRASHED), None)


def result(way: Rolled) -> BoundaryResult:
    """One way's own result for the record: status (`passed` until the verdict settles it, `bug`,
    `unconfirmed`, `crashed`, `not run`, `refused`), its numbers, why, and its confirmation."""
    e = way.entry
    out = BoundaryResult(e.status, max_abs=e.max_abs, multiple=e.multiple, why=e.why, confirmation=e.confirmation)
    for name in ("declared", "api_finding"):  # unsupported
        if e.given(name):
            setattr(out, name, getattr(e, name))
    return out


def in_words(e: BoundaryResult) -> str:
    """One way's result in a few words: "bug 2.1e+04x", "within the floor", "refused (why)"."""
    st = e.status
    if st in (BUG, UNCONFIRMED):
        return f"{st} {e.multiple or 0:.2g}x"
    if st == UNSUPPORTED:  # the declaration follows in the summary ("generate() refuses ...")
        found = e.api_finding
        return f"{st}, yet it ran: {found['status']} {e.multiple or 0:.2g}x" if found else f"{st}"
    return "within the floor" if st == PASSED and not e.why else f"{st} ({e.why})"


def summary(ways: dict, refuses: Optional[str]) -> Optional[str]:
    """"their crop: bug 2.1e+04x, copy: within the floor; generate() refuses assisted decoding: ..."
    where the two ways differ or fail; None when both stay within the floor."""
    crop, copy = ways["crop"].entry, ways["copy"].entry
    if crop.status == copy.status == PASSED and not (crop.why or copy.why):
        return None
    if crop.status == copy.status == NOT_RUN and crop.why == copy.why:
        return None  # the runner can take nothing back: the entry's own why says it
    out = f"their crop: {in_words(crop)}, copy: {in_words(copy)}"
    if refuses and crop.status != PASSED:
        out += f"; generate() refuses assisted decoding: {refuses}"
    return out


def generate_refuses(runner, tokens) -> Optional[str]:
    """Why `generate()` refuses assisted decoding for the model (`hf_runner.assisted_refusal`), or None."""
    return hf_runner.assisted_refusal(runner, tokens) if isinstance(runner, hf_runner.CacheRunner) else None


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


def settle(entries: dict, verdict: str) -> dict:
    """Entries that passed take the architecture's verdict when it is ok or inconclusive (a pass
    on state never shown to matter is no ok); beside another schedule's failure see `beside`."""
    for e in entries.values():
        for part in (e, e.their_crop, e.copy):  # rollback: each run's own result too
            if part and part.status == PASSED and verdict in (OK, INCONCLUSIVE):
                part.status = str(verdict)
    return entries


def beside(entries: dict, worst: str) -> dict:
    """Entries beside the failing schedule `worst`. One that agreed is `not judged`: an ok needs
    the power check, which runs only when every schedule agrees (rollback's `their_crop` and `copy`
    keep their own results). A failed one beside a failing step plan says it may be that plan's
    error: its cached steps may fail without any padding or rollback."""
    plan = worst not in census_schedules()
    why = f"{NOT_JUDGED_WHY} ({worst})" if plan else f"{worst} failed beside it"
    for e in entries.values():
        if e.status == PASSED:
            e.status, e.why = NOT_JUDGED, "; ".join(filter(None, [why, e.why]))
        if e.status == BUG and plan:
            e.why = "; ".join(filter(None, [e.why, f"{worst!r} fails too, without this boundary"]))
    return entries
