"""One architecture checked the way the scan checks every one.

`check(model_type)` derives a tiny config (`tiny.derive`), one per layer kind with that kind as layer 0
when there are several (`tiny.layers`; `orders`: the worst order heads the record, `variants` lists each), builds
the model seeded, and runs it:

1. the reference is the full pass in float32; the noise floor is the full pass in float64 against
   it (`smearcli.judging.evidence.floor`), so no schedule under test, decode included, can raise the floor;
   the reference is checked first (`causal`): a full pass whose earlier positions move when the last
   tokens are removed or changed leaks future tokens, and that is the finding (no cached path is
   judged against it);
2. every schedule of `split_points` (decode, prefill, chunks of 16, a prefill then single tokens,
   chunk widths below and at the conv width, around the sliding window and the SSM chunk size,
   seeded odd widths) and the project's `padded` and `rollback` boundaries (`boundary`: a padded
   batch with its mask; drafts partly rejected, the cache cropped back or restored from a copy)
   are measured against the reference;
3. a run past the tolerance is a candidate: it and the full pass are rerun with the model in
   float64 under the precision lift (`evidence.Confirmer`). It is a `bug` when its lifted error
   keeps at least half its float32 size, float32 rounding (not a finding: the schedule counts as
   passed, and the record says so) when it falls to float64 rounding, `unconfirmed` otherwise. A
   bug is then replicated before it is called one (`ties.replicate`: under a tie-break where a
   top-k tied, on a second seed, at the default head and expert counts, `derive.default_counts`);
   every finding is run through the public API (`reach`) and names the classes its born-in class
   declares it copies (`groups.copies`). A
   finding's shape is named (`shapes.classify`): a boundary's own shape for padded and rollback;
   otherwise from reruns with explicit `position_ids` / attention mask, the dropped-state
   hypothesis replayed, and the error profile;
4. no finding: before `ok`, the check must have power (`evidence.power`): zeroing each kind of
   state the cache carries must move the later logits by 100x the tolerance. When it does not, the
   init scale is raised (seeded) and the whole check repeats; when nothing gets there the verdict
   is `inconclusive`, with the fraction of each state's effect the check could have seen.

An exception inside the model on a cached path, where the full pass runs, is the architecture's
result (`crashed`, with the frame that raised; the notes name the schedule); a config or a model
that cannot be built, or a full pass (no cache) that fails on the tiny config and the scan's
tokens, is `not built` with the reason: our inputs do not run, which says nothing of their cache.
The result is a `census.record.Record`: it stays one through `isolate`, the record file and the report.
"""

from __future__ import annotations

import random
from typing import Optional

import torch

from ...judging import evidence, judge
from ...util import frames
from ...measure.metrics import RunMetrics
from ...util.defaults import NOISE_MARGIN
from . import api as hf_api
from ...measure.schedules import run_schedule, run_steps
from ...judging.verdicts import BUG, CRASHED, INCONCLUSIVE, OK, ROUNDING, UNCONFIRMED
from . import hidden_names
from .cache_runner import CacheRunner, full_run
from . import born, boundary, causal, diagnose, orders, ties
from ...measure import shapes
from ...census.record import Record, ScheduleResult, new as record
from .boundary import WINDOW_KEYS, measured, transformers_frame
from ...tiny.derive import CONV_KEYS, build, default_counts, derive, first_int, parameters, vocab_of
from .reference import INIT_LADDER, NO_POWER_NOTE, init_note

T = 49  # one past a multiple of the 16-token chunks
SSM_KEYS = ("chunk_size", "mamba_chunk_size")
BLOCK_KEYS = ("block_size", "attention_chunk_size", "index_block_size")  # blockwise kernels (`derive.BLOCK`)


def cycle(widths, total: int) -> list[int]:
    """Steps cycling through `widths` (each >= 1) until they sum to `total`."""
    out, i = [], 0
    widths = [max(1, int(w)) for w in widths]
    while sum(out) < total:
        out.append(min(widths[i % len(widths)], total - sum(out)))
        i += 1
    return out


def split_points(cfg, total: int = T, seed: int = 0) -> dict[str, list[int]]:
    """name -> steps: the schedules the scan runs on one architecture, from its config."""
    out = {"decode": [1] * total, "prefill": [total], "chunks of 16": cycle([16], total),
           "prefill, then single tokens": [total - 6] + [1] * 6}
    conv = first_int(cfg, CONV_KEYS)
    if conv:
        out[f"widths {conv - 1},{conv} (conv {conv})"] = [conv + 1] + cycle([conv - 1, conv], total - conv - 1)
    win = first_int(cfg, WINDOW_KEYS)
    if win and win < total:
        out[f"widths around the window {win}"] = cycle([win - 1, win, win + 1], total)
    ssm = first_int(cfg, SSM_KEYS)
    if ssm and ssm < total:
        out[f"widths around the SSM chunk {ssm}"] = cycle([ssm - 1, ssm + 1, ssm], total)
    block = first_int(cfg, BLOCK_KEYS)
    if block and block < total:
        out[f"widths around the block {block}"] = cycle([block - 1, block + 1, block], total)
    rng = random.Random(seed)
    out["odd widths (seeded)"] = cycle([rng.randint(2, 13) for _ in range(12)], total)
    return out



def path_name(schedule: str, steps) -> str:
    """A `compare --impl hf` run's schedule named as `split_points` names the same steps, so that
    what upstream knows about a census path covers it (`census.known.of_run`): chunked prefill in
    equal chunks is "chunks of N", one step then single tokens "prefill, then single tokens", any
    other widths (speculative's prefill, then verify steps of the draft) "widths a,b,..."; every
    other schedule keeps its name."""
    steps = [int(n) for n in steps]
    if schedule not in ("chunked", "speculative") or not steps:
        return schedule
    if len(steps) > 1 and steps[0] > 1 and all(n == 1 for n in steps[1:]):
        return "prefill, then single tokens"
    if all(n == steps[0] for n in steps[:-1]) and steps[-1] <= steps[0]:
        return f"chunks of {steps[0]}"
    return "widths " + ",".join(map(str, steps[:12]))


def layer_names(runner: CacheRunner, tokens) -> list[str]:
    """The capture points' names, as `compare --impl hf` names them (`hf.hidden_names`: emb,
    layer0, ..., or hidden_states[i] where the count does not say which is which)."""
    try:
        out = runner.forward(tokens[:, :2], True)
    except Exception:
        return ["logits"]
    if not out.hiddens:
        return ["logits"]
    return hidden_names(runner.model, tokens[:, :2], out.hiddens)


def run_all(runner, tokens, plans: dict, ref, noise, tolerance, refused: dict) -> dict[str, RunMetrics]:
    """Every plan measured; a plan their code refuses on purpose (`frames.declared_limit`: "only
    supported for ... of length 1") goes into `refused` (name -> their message) and is not run:
    a documented limit of their API is not a crash, and the verdict rests on the plans it accepts."""
    out = {}
    for name, steps in plans.items():
        try:
            run = run_steps(runner, tokens, steps, capture=ref.hiddens is not None, schedule=name)
        except Exception as e:
            limit = frames.declared_limit(e, "transformers")
            if limit:
                refused[name] = limit
                continue
            e.schedule = name  # the record says which cached schedule raised where the full pass ran
            raise
        out[name] = measured(ref, run, noise, tolerance)
    return out


def check(model_type: str, seed: int = 0, tolerance: float = NOISE_MARGIN, total: int = T,
          config=None, repro_dir=None) -> Record:
    """The record of one architecture (see the module docstring); `config` replaces the derived
    one. With `repro_dir`, a finding gets a standalone reproducer there, run once: its path and
    exit status are in the record (`reproducer`, `reproducer_status`)."""
    import time

    from ...census import budget

    t0 = time.monotonic()
    rec = _check_orders(model_type, seed, tolerance, total, config)
    declare_copies(rec)
    budget.stage(rec)  # the verdict is in: kept even if a reproducer runs out of time
    if rec.built_from is not None and (rec.verdict in (BUG, UNCONFIRMED) or (rec.verdict == CRASHED and rec.floor)):
        reachability(rec, seed, tolerance, total)  # every finding, and a crash where its floor was measured
        budget.stage(rec)
    elif rec.verdict in (OK, INCONCLUSIVE) and rec.built_from is not None and rec.shape != shapes.LEAK:
        from . import reach  # generate's own paths, where the census's cached schedules all agree

        reach.through_generate(rec, lambda s: build(rec.built_from, rec.init, seed + s), lambda s: torch.randint(
            0, rec.vocab, (1, total), generator=torch.Generator().manual_seed(seed + s)), tolerance, seed=seed)
        budget.stage(rec)
    if rec.verdict == BUG and repro_dir is not None and rec.built_from is not None:
        from . import findings_files

        findings_files.attach(rec, repro_dir, budget.later_limit(time.monotonic() - t0), budget.stage,
                              seed=seed, vocab=rec.vocab, margin=tolerance, total=total)
    return rec


def declare_copies(rec: Record) -> None:
    """A finding's born-in class: the classes it declares it copies in transformers' source
    (`groups.copies`), into `born_in.copies`, so the records alone group it (`groups`)."""
    import os

    import transformers

    from . import groups

    b = rec.born_in
    if rec.verdict in groups.FINDINGS and b is not None and b.file and b.class_name:
        b.copies = groups.copies(b.file, b.class_name, os.path.dirname(transformers.__file__))


def reachability(rec: Record, seed: int, tolerance: float, total: int) -> None:
    """The finding run through transformers' public API (`reach.paths`: generate, chunked prefill, a
    left-padded batch, an assistant model of other weights; for a full pass that leaks,
    `reach.leak_paths`: who runs that full pass), into the record's `reach`."""
    from . import reach

    tokens = torch.randint(0, rec.vocab, (1, total), generator=torch.Generator().manual_seed(seed))
    threshold = tolerance * (rec.floor or 0.0)
    if rec.shape == shapes.LEAK:  # no cached path to blame: who runs the full pass that leaks
        rec.reach = reach.leak_paths(build(rec.built_from, rec.init, seed), tokens, threshold, rec.model_type)
        return
    model, assistant = build(rec.built_from, rec.init, seed), build(rec.built_from, rec.init, seed + 1)
    rec.reach = reach.paths(model, tokens, threshold, assistant)


def _check_orders(model_type, seed, tolerance, total, config) -> Record:
    """Every layer order of the derived config checked, one record (`orders.combine`: the worst
    heads it); a caller's `config` is checked as it is, in its own order."""
    if config is not None:
        return _check(model_type, seed, tolerance, total, config, None, None)
    d = derive(model_type)
    if d.error:
        return record(model_type, judge.stopped(judge.DERIVE), reason=d.error)
    recs = [record(model_type, judge.stopped(judge.DERIVE), reason=v.error, config=v.summary()) if v.error else
            _check(model_type, seed, tolerance, total, v.config, v.summary(), v.changed) for v in d.variants]
    return orders.combine(recs, [v.order for v in d.variants])


def _check(model_type, seed, tolerance, total, config, summary: Optional[dict], changed: Optional[dict]) -> Record:
    """One config's record; `changed`: its derivation (key -> (default, tiny)), None for a config
    given as it is (no default counts to restore)."""
    vocab = vocab_of(config)
    tokens = torch.randint(0, vocab,
                           (1, total), generator=torch.Generator().manual_seed(seed))
    plans = split_points(config, total, seed)
    base = dict(config=summary, vocab=vocab)
    last = None
    for init in INIT_LADDER:
        try:
            model = build(config, init, seed)
        except Exception as e:
            return record(model_type, judge.stopped(judge.BUILD), reason="the model cannot be built from the tiny config: "
                          + transformers_frame(e), **base)
        try:
            with ties.watching() as seen:
                res = check_model(model, tokens, plans, tolerance)
            if res["verdict"] == BUG:  # replicated (another seed, a tie-break, the default counts) first
                defaults = None if changed is None else default_counts(config, changed, parameters, total)
                res = ties.replicate(res, seen.ties, lambda s, broke, cfg=None: recheck(
                    cfg or config, init, s, broke, total, vocab, plans, tolerance, safe=cfg is not None), seed, defaults)
        except Exception as e:  # a cached path raised where the full pass runs (`check_model`)
            where = getattr(e, "schedule", None)
            return record(model_type, judge.stopped(judge.CACHED_PATH), reason=transformers_frame(e),
                          model_class=type(model).__name__,
                          init=init, notes=[f"{where} raised; the full pass runs"] if where else [],
                          floor=getattr(e, "floor", None), built_from=config, **base)
        res.update(base, init=init)
        if res["verdict"] != INCONCLUSIVE:
            if init is not None:
                res["notes"].append(init_note(init))
            return record(model_type, **res, built_from=config)
        last = res
    last["notes"].append(NO_POWER_NOTE)
    return record(model_type, **last)


def recheck(config, init, seed: int, broke: bool, total: int, vocab: int, plans: dict, tolerance: float,
            safe: bool = False) -> dict:
    """`check_model` again on `seed` (its weights and tokens), under the tie-break when `broke`;
    its `_ties`: the top-k calls with a tie at their edge (`ties.watching`). With `safe` (another
    config: the default counts), a model that cannot be built or a cached path that raises is that
    rerun's result (`not built`, `crashed`, with the reason), not the architecture's."""
    tokens = torch.randint(0, vocab, (1, total), generator=torch.Generator().manual_seed(seed))
    try:
        model = build(config, init, seed)
    except Exception as e:
        if not safe:
            raise
        return {"verdict": judge.stopped(judge.BUILD), "notes": [], "_ties": 0,
                "reason": "the model cannot be built: " + transformers_frame(e)}
    try:
        with ties.tie_break() if broke else ties.watching() as seen:
            out = check_model(model, tokens, plans, tolerance)
    except Exception as e:  # a cached path raised where the full pass runs (`check_model`)
        if not safe:
            raise
        return {"verdict": judge.stopped(judge.CACHED_PATH), "notes": [], "_ties": 0, "reason": transformers_frame(e)}
    out["_ties"] = getattr(seen, "ties", 0)
    return out


def check_model(model, tokens, plans: dict, tolerance: float = NOISE_MARGIN, make=CacheRunner) -> dict:
    """Verdict fields of one built model on `plans` (name -> steps), then the padded and rollback
    boundaries (`boundary`); `make(model, layers, crop=False)` builds the runner they run on."""
    if hf_api.cache_keyword(model) is None:
        return {"verdict": judge.stopped(judge.NO_CACHE), "model_class": type(model).__name__, "notes": [],
                "reason": f"{type(model).__name__}.forward takes no cache (none of {', '.join(hf_api.KEYWORDS)})"}
    probe = CacheRunner(model)
    runner = make(model, layer_names(probe, tokens))
    try:
        ref = full_run(runner, tokens, capture=len(runner.layers) > 1)
    except Exception as e:  # no cache involved: the tiny config or the inputs do not run, no finding
        return {"verdict": judge.stopped(judge.REFERENCE), "model_class": type(model).__name__, "notes": [],
                "reason": "the full pass (no cache) fails on the tiny config: " + transformers_frame(e)}
    if ref.logits.dim() != 3 or ref.logits.shape[:2] != tokens.shape:
        return {"verdict": judge.stopped(judge.REFERENCE), "model_class": type(model).__name__, "notes": [],
                "reason": f"the full pass returns logits of shape {tuple(ref.logits.shape)}, not (batch, "
                          f"{tokens.size(1)}, vocab): not a causal LM over its input"}
    unusable = evidence.unusable(ref)
    if unusable:  # the derived config overflows: the full pass does not run on these inputs
        return {"verdict": judge.stopped(judge.REFERENCE), "model_class": type(model).__name__, "notes": [],
                "reason": unusable}
    f64 = evidence.Float64(runner, tokens, capture=ref.hiddens is not None)  # the floor's and the confirmations'
    noise = evidence.floor(runner, ref, tokens, torch.float32, f64)
    floor_source = noise.source
    leaked = causal.finding(runner, tokens, ref, noise, tolerance)  # the reference checked first
    if leaked is not None:
        return {"model_class": type(model).__name__, "floor": noise.per_layer[-1], "floor_source": floor_source,
                **leaked}
    refused: dict = {}
    try:
        ms = run_all(runner, tokens, plans, ref, noise, tolerance, refused)
    except Exception as e:  # the crash's record keeps the floor: its reach is judged against it
        e.floor = noise.per_layer[-1]
        raise
    bounds = boundary.run_boundaries(model, make, runner.layers, tokens, ref, noise, tolerance)
    ms.update(bounds.metrics)
    plans = {**plans, **bounds.steps}
    floor = noise.per_layer[-1]
    out = {"model_class": type(model).__name__, "floor": floor, "floor_source": floor_source,
           "schedules": {k: ScheduleResult(max_abs=m.max_abs_logits, multiple=m.logits_multiple, passed=m.passed)
                         for k, m in ms.items()}, "notes": runner.notes() + bounds.notes,
           "boundaries": bounds.entries}
    if refused:
        out["notes"].append(f"not run, refused by their code as a use it does not support: {', '.join(refused)} "
                            f"({next(iter(refused.values()))}); the verdict rests on the schedules it accepts")
    confs, reruns = confirmed(evidence.Confirmer(runner, tokens, f64), bounds.runners, tokens, plans,
                              {k: m for k, m in ms.items() if not m.passed}, out)
    failing = [k for k, m in ms.items() if k not in boundary.SCHEDULES and not out["schedules"][k].passed]
    for name in boundary.parts_fail(bounds.entries, failing):  # its part's error, not the combination's
        ms.pop(name, None)
    runs = [judge.Run(k, m.passed, confs.get(k)) for k, m in ms.items()]
    judged = judge.judge(runs)
    bad = {k: ms[k] for k in judged.named(BUG, UNCONFIRMED)}
    if bad:  # the step plans' worst heads the record: padded and rollback run cached steps too
        bugs = {k: ms[k] for k in judged.named(BUG)}
        pool = bugs or bad
        plain = {k: m for k, m in pool.items() if k not in boundary.SCHEDULES}
        alone = {k: m for k, m in pool.items() if k not in boundary.COMBINED}  # a boundary before its combinations
        name, worst = max((plain or alone or pool).items(), key=lambda kv: kv[1].max_abs_logits)
        boundary.beside(bounds.entries, name)  # a boundary that agreed is not judged beside it
        confirmer, rerun = reruns[name]  # the headline's third number: a plain float64 cast
        out["schedules"][name].confirmation.float64 = confirmer.plain(rerun)
        fd = worst.first_departure
        out.update(verdict=judged.word, worst_schedule=name, max_abs=worst.max_abs_logits,
                   multiple=worst.logits_multiple, steps=plans[name],
                   confirmation=out["schedules"][name].confirmation,
                   born_at=None if fd is None else f"{(runner.layers)[fd[0]] if fd[0] < len(runner.layers) else 'logits'}@{fd[1]}",
                   born_in=born.born_in(runner, tokens, plans[name], fd, tolerance, schedule=name))
        if name in boundary.SCHEDULES:  # the boundary's own shape (`boundaries.SHAPES`)
            fixed = note = None
            out["shape"] = shapes.classify(worst.abs_err[-1].tolist(), plans[name], 0.0, schedule=name)
        else:
            out["shape"], fixed, note, kinds = diagnose.name_shape(model, tokens, plans, name, worst, ms, ref, noise,
                                                                   tolerance, first_int(model.config, WINDOW_KEYS))
            born.narrow(out["born_in"], kinds)  # the suspect lines of the state the replay zeroed
        if fixed:
            out["notes"].append(f"explicit {fixed} makes {name} pass")
        if note:
            out["notes"].append(note)
        return out
    raised = boundary.crash(bounds.entries)  # a boundary that raised in their code, every run else agreeing
    if raised:
        boundary.beside(bounds.entries, raised[0])
        out.update(verdict=judge.stopped(judge.CACHED_PATH), worst_schedule=raised[0], reason=raised[1])
        out["notes"].append(f"{raised[0]} raised; the full pass runs")
        return out
    power = evidence.power(runner, tokens, tolerance * floor)
    out["power"] = power.to_json()
    out["notes"].append(power.describe())
    out["verdict"] = judge.judge(runs, power).word
    boundary.settle(bounds.entries, out["verdict"])
    return out


def confirmed(main, used: dict, tokens, plans: dict, bad: dict, out: dict) -> tuple[dict, dict]:
    """Each run past the tolerance rerun in float64, lifted (`evidence.Confirmer`), its status
    (`judge.status`) and confirmation in `out["schedules"][name]`: (name -> its `Confirmation`,
    name -> (its confirmer, its rerun))."""
    confs, confirmers, reruns = {}, {id(main.runner): main}, {}
    for name, m in bad.items():
        r = used.get(name, main.runner)
        if id(r) not in confirmers:  # a boundary's runner: its own twin, the one lifted full pass
            confirmers[id(r)] = evidence.Confirmer(r, tokens, main.f64.sibling(r))
        if name in boundary.SCHEDULES:
            rerun = lambda t, name=name: run_schedule(t, tokens, name, capture=False)
        else:
            rerun = lambda t, steps=plans[name], name=name: run_steps(t, tokens, steps, schedule=name)
        reruns[name] = confirmers[id(r)], rerun
        c = confs[name] = confirmers[id(r)](rerun, m.max_abs_logits)
        status = judge.status(judge.Run(name, False, c))
        entry = out["schedules"][name]
        entry.status, entry.confirmation = str(status), c.to_json()
        if status == ROUNDING:
            entry.passed = True
            out["notes"].append(f"{name}: {c.phrase()}")
            if name in out["boundaries"]:
                e = out["boundaries"][name]
                e.status, e.shape, e.why = boundary.PASSED, None, c.why
        elif name in out["boundaries"]:
            # a boundary's provisional status becomes the judge's; rollback's headline holds its way's,
            # rerun already (`boundary.confirm`), which only unconfirmed moves
            e = out["boundaries"][name]
            if e.status == boundary.DEPARTS or status == UNCONFIRMED:
                e.status = status
    return confs, reruns

