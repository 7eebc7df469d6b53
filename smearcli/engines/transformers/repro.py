"""A standalone reproducer per finding (smearcli scan).

`write(record, config, path)` writes one Python file that needs torch and transformers only (no
smearcli import): it rebuilds the tiny config, seeds and builds the model, runs the full pass, the
failing schedule through the model's own cache, and the full pass in float64 for the noise floor,
then both again in float64, plainly and with the model's float32 requests lifted to float64
(`LIFT`), prints the three numbers and exits 1 while the schedule is further from the full pass
than `MARGIN` x the floor and keeps at least half that size lifted, 0 once it is fixed (or when
the error was float32 rounding). A finding of a registered boundary (padded, rollback) gets
`BOUNDARY` instead, around the boundary's own fragment (`steps.Repro`: the row beside its prefix
right- and left-padded in one batch with the mask, or the prefill then drafts partly rejected and
taken back through their cache API as assisted generation calls it (`their_crop_fragment`, which
every boundary reproducer holds) or restored from a copy), against the row alone. `run(path)`
runs it in an isolated Python (`-I`: no PYTHONPATH, no user site) and returns the exit status,
which the scan records.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Optional

from . import api
from ...measure.shapes import LEAK, THROUGH_GENERATE
from ...util.defaults import (
    GENERATE_BEAMS, GENERATE_CHUNK, GENERATE_NEW, GENERATE_PADS_INSIDE, GENERATE_PATH, NOISE_MARGIN,
)
from ...measure.schedules import SCHEDULES
from ...util.formatters import fmt_steps
from ...census.record import BoundaryResult, Record

# what every reproducer builds its model and feeds its cache with (a template fragment: braces
# doubled); the cache API is detected by smearcli's own detector, embedded as source (`hf.api`)
MODEL = api.standalone().replace("{", "{{").replace("}", "}}") + '''

def build():
    cfg = transformers.CONFIG_MAPPING[CONFIG.get("model_type") or MODEL_TYPE](**CONFIG)  # a text config's own type
    torch.manual_seed(SEED)
    return transformers.AutoModelForCausalLM.from_config(cfg).float().eval()


def step(model, ids, cache, pos):
    """One cached call over `ids` at position `pos`: (logits, the cache to pass next)."""
    keyword = cache_keyword(model)
    kw = {{"use_cache": True}}
    if cache is not None:
        kw[keyword] = cache
    if passes_cache_position(model, keyword):
        kw["cache_position"] = torch.arange(pos, pos + ids.size(1))
    o = model(input_ids=ids, **kw)
    got = out_cache(o)
    if got is None and cache is None:  # the model wants the caller to create its cache
        kw[keyword] = got = caller_cache(model)
        o = model(input_ids=ids, **kw)
    return o.logits.float(), got if got is not None else cache
'''

# float64 with the model's float32 requests lifted (smearcli.judging.evidence.PrecisionLift, restated so
# the reproducer needs no smearcli): a logic error keeps its size there, float32 rounding vanishes
LIFT = '''class Lift(torch.overrides.TorchFunctionMode):
    """float32 requests inside the model's code (dtype=torch.float32, .to(torch.float32), .float())
    become float64 ones: its routers, rotary and softmax upcasts round in float64 too."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {{}})
        if func is torch.Tensor.float:
            return args[0].double()
        if kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = torch.float64
        return func(*tuple(torch.float64 if a is torch.float32 else a for a in args), **kwargs)


def in_float64(model):
    m = copy.deepcopy(model).double()
    try:
        m.set_experts_implementation("eager")  # grouped matrix multiplication refuses float64
    except Exception:
        pass
    return m


def distance(model, ids, lift):
    """(max |dlogit| of the schedule against the full pass, the full pass) with `model`."""
    default = torch.get_default_dtype()
    if lift:
        torch.set_default_dtype(torch.float64)
    try:
        with torch.inference_mode(), (Lift() if lift else contextlib.nullcontext()):
            full = model(input_ids=ids, use_cache=False).logits.double()
            return float((schedule(model, ids).double() - full).abs().max()), full
    finally:
        torch.set_default_dtype(default)
'''

# the end of every reproducer: the full pass, the run under test, the float32 floor, the run again in
# float64 plain and lifted, the numbers printed and the exit status; {length} and {what} are
# filled in by each template, which defines schedule(model, ids)
MAIN = LIFT + '''

def main():
    model = build()
    ids = torch.randint(0, {vocab}, (1, {length}), generator=torch.Generator().manual_seed(SEED))
    err, full = distance(model, ids, lift=False)
    m64 = in_float64(model)
    _, full64 = distance(m64, ids, lift=True)
    floor = max(float((full64 - full).abs().max()), torch.finfo(torch.float32).eps * float(full.abs().max()))
    plain, _ = distance(m64, ids, lift=False)
    lifted, _ = distance(m64, ids, lift=True)
    print(f"transformers {{transformers.__version__}}, torch {{torch.__version__}}: {{MODEL_TYPE}}")
    print(f"{what}: max |dlogit| {{err:.3g}} in float32 ({{err / floor:.3g}}x its floor {{floor:.3g}}), "
          f"{{plain:.3g}} in float64, {{lifted:.3g}} in float64 lifted")
    # a bug leaves the float32 floor and keeps at least half its size in float64, lifted
    bug = err > MARGIN * floor and lifted >= 0.5 * err
    print(f"{what}: " + ("the bug is there" if bug else "no bug: within the floor, or gone in float64 (rounding)"))
    return 1 if bug else 0


if __name__ == "__main__":
    sys.exit(main())
'''

TEMPLATE = '''"""Reproducer: {model_type} ({model_class}) under transformers {version}.

The schedule {schedule!r} (cached steps of {steps_short}) through the model's own cache should
give the logits of one full pass; found by smearcli scan: max |dlogit| {max_abs:.3g}, shape:
{shape}. Needs torch and transformers only. Exit status: 1 while the bug is there, 0 once fixed.
"""
import contextlib
import copy
import inspect
import json
import sys

import torch
import transformers

MODEL_TYPE = {model_type!r}
CONFIG = json.loads({config_json!r})
STEPS = {steps!r}
SEED = {seed!r}
MARGIN = {margin!r}  # an error this many times the float32 rounding floor is no longer rounding


''' + MODEL + '''

def cached(model, ids, steps):
    cache, pos, out = None, 0, []
    for n in steps:
        logits, cache = step(model, ids[:, pos:pos + n], cache, pos)
        out.append(logits)
        pos += n
    return torch.cat(out, dim=1)


def schedule(model, ids):
    return cached(model, ids, STEPS)


''' + MAIN.replace("{length}", "sum(STEPS)").replace("{what}", "full pass vs the cached steps")



# a full pass that reads later tokens (`engines.transformers.causal`): the "schedule" is the same full pass on the
# tokens with the last ones removed, or changed (whichever moves the earlier positions more), its
# earlier positions set against the full pass's, so MAIN's distance measures the leak and nothing else
LEAK_TEMPLATE = '''"""Reproducer: {model_type} ({model_class}) under transformers {version}.

The full pass (no cache) should be causal: the logits at a position must not move when the tokens
after it are removed or changed. Found by smearcli scan: with the last {changed} of {total} tokens
{how}, the earlier positions move by max |dlogit| {max_abs:.3g} (first at position {first}). Every
caller of the model's forward over a whole sequence (scoring, the loss with labels, a prefill) gets
logits that depend on later tokens. Needs torch and transformers only.
Exit status: 1 while the leak is there, 0 once fixed.
"""
import contextlib
import copy
import inspect
import json
import sys

import torch
import transformers

MODEL_TYPE = {model_type!r}
CONFIG = json.loads({config_json!r})
T = {total!r}
CHANGED = {changed!r}  # the last tokens removed, or replaced by the next id
CUT = T - CHANGED  # the positions before it must not move
VOCAB = {vocab!r}
SEED = {seed!r}
MARGIN = {margin!r}  # an error this many times the float32 rounding floor is no longer rounding


''' + MODEL + '''

def probes(ids):
    changed = ids.clone()
    changed[:, CUT:] = (ids[:, CUT:] + 1) % VOCAB
    return ids[:, :CUT], changed


def schedule(model, ids):
    """The full pass's own logits, but before CUT those of the probe that moved them most."""
    full = model(input_ids=ids, use_cache=False).logits
    worst, pick = -1.0, None
    for probe in probes(ids):
        other = model(input_ids=probe, use_cache=False).logits[:, :CUT]
        err = float((other.double() - full[:, :CUT].double()).abs().max())
        if err > worst:
            worst, pick = err, other
    return torch.cat([pick, full[:, CUT:]], dim=1)


''' + MAIN.replace("{length}", "T").replace("{what}", "the full pass vs itself with its last tokens removed or changed")


GENERATE_TEMPLATE = '''"""Reproducer: {model_type} ({model_class}) under transformers {version}.

Greedy generate's {path!r} path should give, at every step, the logits one call without a cache
gives over the tokens it made (beam search: the logits of the same search without a cache);
found by smearcli scan: max |dlogit| {max_abs:.3g}, while every cached schedule it drives through
the model's own cache agrees. Needs torch and transformers only. Exit status: 1 while the bug is
there, 0 once fixed.
"""
import contextlib
import copy
import inspect
import json
import sys

import torch
import transformers

MODEL_TYPE = {model_type!r}
CONFIG = json.loads({config_json!r})
PATH = {path!r}
T = {total!r}
NEW = {new!r}  # tokens generated
CHUNK = {chunk!r}  # prefill_chunk_size
INSIDE = {inside!r}  # pads of the chunked padded batch: they end inside its first chunk
BEAMS = {beams!r}  # beam search's beams
VOCAB = {vocab!r}
SEED = {seed!r}
MARGIN = {margin!r}  # an error this many times the float32 rounding floor is no longer rounding


def build(seed):
    cfg = transformers.CONFIG_MAPPING[CONFIG.get("model_type") or MODEL_TYPE](**CONFIG)
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(cfg).float().eval()


def text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def prompt():
    """The seeded draw, the config's pad id moved one id up (a forward that numbers positions
    skipping its pad id would number a prompt holding it otherwise than generate does)."""
    ids = torch.randint(0, VOCAB, (1, T), generator=torch.Generator().manual_seed(SEED))
    pad = getattr(text_config(transformers.CONFIG_MAPPING[CONFIG.get("model_type") or MODEL_TYPE](**CONFIG)),
                  "pad_token_id", None)
    if isinstance(pad, int) and 0 <= pad < VOCAB and VOCAB > 1:
        ids = ids.masked_fill(ids == pad, (pad + 1) % VOCAB)
    return ids


def greedy(model, ids, mask=None, **kw):
    pad = getattr(text_config(model.config), "pad_token_id", None)
    out = model.generate(input_ids=ids, attention_mask=mask if mask is not None else torch.ones_like(ids),
                         max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, output_logits=True,
                         return_dict_in_generate=True, pad_token_id=pad if isinstance(pad, int) else 0, **kw)
    return out.sequences, torch.stack(list(out.logits), 1).double()


def against_full(model, seq, logits, prompt):
    full = model(input_ids=seq[:, :-1], use_cache=False).logits.double()
    return float((full[:, prompt - 1:prompt - 1 + logits.size(1)] - logits).abs().max())


def fill_id(model):
    """A batch of one's pad id: the lowest id that is not the pad id and whose embedding is not zero."""
    pad = getattr(text_config(model.config), "pad_token_id", None)
    table = model.get_input_embeddings().weight
    return next(i for i in range(min(VOCAB, 64)) if i != pad and (i >= table.size(0) or bool(table[i].any())))


def padded(model, ids, pads, alone=False, **kw):
    short = ids[:, pads:]
    row = torch.cat([torch.full_like(ids[:, :pads], fill_id(model) if alone else 0), short], 1)
    batch = row if alone else torch.cat([ids, row], 0)
    mask = torch.ones_like(batch)
    mask[-1, :pads] = 0
    seq, logits = greedy(model, batch, mask, **kw)
    return against_full(model, seq[-1:, pads:], logits[-1:], short.size(1))


def beam(model, ids):
    """Every step's logits of every beam, cached, against the same search without a cache."""
    def search(use_cache):
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), num_beams=BEAMS, do_sample=False,
                             max_new_tokens=NEW, min_new_tokens=NEW, output_logits=True,
                             return_dict_in_generate=True, use_cache=use_cache,
                             pad_token_id=getattr(text_config(model.config), "pad_token_id", None) or 0)
        return torch.stack(list(out.logits), 1).double()
    return float((search(True) - search(False)).abs().max())


def contrary(assistant):
    """The assistant with its output head rolled by one token (untied from its input embedding):
    its drafts are the token after its own pick, so drafts it shares with the model are rejected."""
    other = copy.deepcopy(assistant)
    head = other.get_output_embeddings()
    with torch.no_grad():
        head.weight = torch.nn.Parameter(head.weight.detach().roll(1, 0).clone())
        if getattr(head, "bias", None) is not None:
            head.bias = torch.nn.Parameter(head.bias.detach().roll(1, 0).clone())
    return other


def cached_greedy(model, ids, cache):
    """The prompt in one forward through `cache`, then NEW - 1 greedy tokens one forward each (the
    cache passed by the name the forward takes: `cache` from 5.24, else `past_key_values`)."""
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    kw = {{name: cache, "use_cache": True}}
    out = model(input_ids=ids, **kw)
    logits, seq = [out.logits[:, -1].double()], ids
    for _ in range(NEW - 1):
        nxt = logits[-1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
        logits.append(model(input_ids=nxt, **kw).logits[:, -1].double())
    return torch.cat([seq, logits[-1].argmax(-1, keepdim=True)], 1), torch.stack(logits, 1)


def early_static(model, ids):
    """A StaticCache initialized in advance with its early_initialization (as the export recipes of
    transformers.integrations.executorch do), each layer given the (heads, head_dim) its lazily
    initialized twin takes in the same run (the export recipes' get_head_shapes for a layer that
    holds no keys): only the early initialization differs."""
    from transformers.integrations.executorch import get_head_shapes

    cfg = model.config.get_text_config(decoder=True)
    lazy = transformers.StaticCache(config=cfg, max_cache_len=ids.size(1) + NEW)
    cached_greedy(model, ids, lazy)
    h0, d0 = get_head_shapes(cfg)
    heads, dims = [], []
    for i, layer in enumerate(lazy.layers):
        keys = getattr(layer, "keys", None)
        known = isinstance(keys, torch.Tensor) and keys.dim() == 4
        heads.append(keys.size(1) if known else h0 if isinstance(h0, int) else h0[i])
        dims.append(keys.size(-1) if known else d0 if isinstance(d0, int) else d0[i])
    early = transformers.StaticCache(config=cfg, max_cache_len=ids.size(1) + NEW)
    one = len(set(heads)) == 1 and len(set(dims)) == 1  # one shape for all: ints, as every release takes
    early.early_initialization(ids.size(0), heads[0] if one else heads, dims[0] if one else dims, model.dtype,
                               ids.device)
    seq, logits = cached_greedy(model, ids, early)
    return against_full(model, seq, logits, ids.size(1))


def path(model, assistant, ids):
    """max |dlogit| of the path against the full pass over the tokens it made."""
    if PATH == "static cache, early-initialized":
        return early_static(model, ids)
    if PATH == "left-padded batch":
        return padded(model, ids, max(1, ids.size(1) // 4))
    if PATH == "left-padded batch of one":
        return padded(model, ids, max(1, ids.size(1) // 4), alone=True)
    if PATH == "prefill_chunk_size, left-padded batch":
        return padded(model, ids, INSIDE, prefill_chunk_size=CHUNK)
    if PATH == "beam search":
        return beam(model, ids)
    kw = {{"prefill_chunk_size": CHUNK}} if PATH == "prefill_chunk_size" else {{}}
    if PATH == "assistant model":
        own, _ = greedy(assistant, ids)
        seq, _ = greedy(model, ids, assistant_model=assistant)
        if torch.equal(own[:, ids.size(1):], seq[:, ids.size(1):]):  # every draft accepted: no crop ran
            assistant = contrary(assistant)
        kw = {{"assistant_model": assistant}}
    if PATH == "static cache":
        kw = {{"cache_implementation": "static"}}
    seq, logits = greedy(model, ids, **kw)
    return against_full(model, seq, logits, ids.size(1))


''' + LIFT.split("\n\n\ndef in_float64")[0] + '''


def in_float64(model):
    m = copy.deepcopy(model).double()
    try:
        m.set_experts_implementation("eager")  # grouped matrix multiplication refuses float64
    except Exception:
        pass
    return m


@contextlib.contextmanager
def lift():
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with Lift():
            yield
    finally:
        torch.set_default_dtype(default)


def main():
    model, assistant = build(SEED), build(SEED + 1)
    ids = prompt()
    with torch.inference_mode():
        full = model(input_ids=ids, use_cache=False).logits.double()
        with lift():
            full64 = in_float64(model)(input_ids=ids, use_cache=False).logits
        floor = max(float((full64 - full).abs().max()), torch.finfo(torch.float32).eps * float(full.abs().max()))
        try:
            err = path(model, assistant, ids)
        except Exception as e:  # generate accepted the call, then raised inside transformers: their crash
            print(f"transformers {{transformers.__version__}}, torch {{torch.__version__}}: {{MODEL_TYPE}}")
            print(f"generate, {{PATH}}: raises: {{type(e).__name__}}: {{str(e).splitlines()[0] if str(e) else ''}}")
            return 1
        with lift():
            wide = path(in_float64(model), in_float64(assistant), ids)
    print(f"transformers {{transformers.__version__}}, torch {{torch.__version__}}: {{MODEL_TYPE}}")
    print(f"generate, {{PATH}}: max |dlogit| {{err:.3g}} in float32 ({{err / floor:.3g}}x its floor {{floor:.3g}}), "
          f"{{wide:.3g}} in float64 lifted")
    # a bug leaves the float32 floor and keeps at least half its size in float64, lifted
    bug = err > MARGIN * floor and wide >= 0.5 * err
    print(f"generate, {{PATH}}: " + ("the bug is there" if bug else "no bug: within the floor, or gone in float64"))
    return 1 if bug else 0


if __name__ == "__main__":
    sys.exit(main())
'''


def write_generate(record: Record, config: dict, path: Path, seed: int, vocab: int, margin: float,
                   total: int) -> Path:
    """The reproducer of a finding only generate's own paths show (`engines.transformers.reach.through_generate`):
    the same greedy call (or beam search) on the same tiny config and prompt (its pad id moved up, as
    `reach.without_pad` moves it), against the full pass (or the search without a cache), in
    float32 and in float64 lifted."""
    import transformers

    path.write_text(GENERATE_TEMPLATE.format(
        model_type=record.model_type, model_class=record.model_class or "?", version=transformers.__version__,
        path=record.worst_schedule[len(GENERATE_PATH):], max_abs=record.max_abs or 0.0,
        config_json=json.dumps(config, default=str), total=total, new=GENERATE_NEW, chunk=GENERATE_CHUNK,
        inside=GENERATE_PADS_INSIDE, beams=GENERATE_BEAMS, vocab=vocab, seed=seed, margin=margin), encoding="utf-8")
    return path


def their_crop_fragment() -> str:
    """The reproducers' `their_crop(model, ids)` (a template fragment, no braces): the rollback
    schedule taken back through their cache API as transformers' assisted generation calls it
    (`_assisted_decoding`): the cache `generate()` makes, `activate_past_recording(...)` before
    the prefill with what the installed release's generate passes it (`recording`, the embedded
    detector: `recurrent_states_to_keep=DRAFT - 1` from 5.25 on, nothing before), then
    `cache.crop(-rejected)` after every forward, `crop(0)` where none was rejected. The scan's
    crop-mode runner (`engines.transformers.cache_runner`) makes the same calls."""
    return '''def generation_cache(model):
    """The cache generate() makes before the prefill, or None where it makes none."""
    if not model._supports_default_dynamic_cache():
        return None
    cfg = model.config.get_text_config(decoder=True)
    if model.config.is_encoder_decoder:
        return transformers.EncoderDecoderCache(transformers.DynamicCache(config=cfg),
                                                transformers.DynamicCache(config=cfg))
    return transformers.DynamicCache(config=cfg)


def their_crop(model, ids):
    """A prefill, then drafts of DRAFT tokens whose last REJECT are wrong, each taken back with the
    cache's own crop as assisted generation takes it back."""
    vocab = max(int(ids.max()) + 1, 2)
    made = generation_cache(model)
    drafted = DRAFT - 1  # tokens drafted per verify step, as generate counts them (num_drafting_tokens)
    records = generate_records()  # 5.14 on; up to 5.13 generate records nothing and never crops 0
    if made is not None and records:
        made.activate_past_recording(**recording(made, drafted))  # generate: before the prefill
    out, cache = step(model, ids[:, :PROMPT], made, 0)
    if made is None and records:  # a cache the model made itself: recorded from the prefill on
        cache.activate_past_recording(**recording(cache, drafted))
    if records:
        cache.crop(0)  # generate crops after every forward: 0 tokens when none was rejected
    logits, pos = [out], PROMPT
    while pos < T:
        n = min(DRAFT, T - pos)
        keep = n if n < DRAFT else n - REJECT
        draft = ids[:, pos:pos + n]
        if keep < n:
            draft = torch.cat([draft[:, :keep], (draft[:, keep:] + 1) % vocab], dim=1)
        out, cache = step(model, draft, cache, pos)
        logits.append(out[:, :keep])
        if keep < n or records:  # a negative count: the rejected tokens (0: none, asked from 5.14 on)
            cache.crop(keep - n)
        pos += keep
    return torch.cat(logits, dim=1)
'''


BOUNDARY = '''"""Reproducer: {model_type} ({model_class}) under transformers {version}.

{what} should give the logits of the row alone (one full pass); found by smearcli scan:
max |dlogit| {max_abs:.3g}, shape: {shape}. Needs torch and transformers only.
Exit status: 1 while the bug is there, 0 once fixed.
"""
import contextlib
import copy
import inspect
import json
import sys

import torch
import transformers

MODEL_TYPE = {model_type!r}
CONFIG = json.loads({config_json!r})
SCHEDULE = {schedule!r}
T = {total!r}
SEED = {seed!r}
MARGIN = {margin!r}  # an error this many times the float32 rounding floor is no longer rounding


''' + MODEL + '''

''' + their_crop_fragment() + '''
{fragment}

def schedule(model, ids):
    return {function}(model, ids)


''' + MAIN.replace("{length}", "T").replace("{what}", "the row alone vs {{SCHEDULE}}")


def function_name(schedule: str) -> str:
    """The Python name of a boundary's function in its reproducer fragment: "padded-chunks" defines
    `padded_chunks` (a combination's name joins its parts with a dash)."""
    return schedule.replace("-", "_")


def boundary_source(schedule: str, entry: Optional[BoundaryResult], total: int) -> Optional[str]:
    """The reproducer fragment of a registered boundary (`steps.Repro`), its fields filled from the
    boundary's census `entry` (None: it has none), as a template fragment again (braces doubled);
    None when `schedule` has none. A boundary registers its fragment's values in the core, which
    knows nothing of the census's types: it reads the entry's JSON form."""
    s = SCHEDULES.get(schedule)
    if s is None or s.repro is None:
        return None
    given = entry.to_json() if entry is not None else {}
    return s.repro.source.format(**s.repro.values(given, total)).replace("{", "{{").replace("}", "}}")


def write(record: Record, config, path: Path, seed: int = 0, vocab: int = 256,
          margin: float = NOISE_MARGIN, schedule: Optional[str] = None, total: int = 49) -> Path:
    """The reproducer of one finding (`record`: a scan record with `steps`), written to `path`;
    `schedule` a registered boundary with a reproducer fragment (padded, rollback; default: the
    record's worst schedule when it is one) writes that boundary's reproducer over `total` tokens,
    its numbers from `record.boundaries`."""
    import transformers

    d = {k: v for k, v in config.to_dict().items() if k not in ("transformers_version", "architectures")}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    schedule = schedule or record.worst_schedule
    if record.shape == LEAK:
        return write_leak(record, d, path, seed, vocab, margin)
    if record.shape == THROUGH_GENERATE:
        return write_generate(record, d, path, seed, vocab, margin, total)
    e = (record.boundaries or {}).get(schedule) or BoundaryResult()
    fragment = boundary_source(schedule, e, total)
    if fragment is not None:
        path.write_text(BOUNDARY.replace("{fragment}", fragment).format(
            model_type=record.model_type, model_class=record.model_class or "?",
            version=transformers.__version__, what=SCHEDULES[schedule].repro.what,
            max_abs=e.max_abs or record.max_abs or 0.0, shape=e.shape or record.shape,
            config_json=json.dumps(d, default=str), schedule=schedule, function=function_name(schedule), total=total,
            seed=seed, margin=margin, vocab=vocab), encoding="utf-8")
        return path
    path.write_text(TEMPLATE.format(
        model_type=record.model_type, model_class=record.model_class or "?",
        version=transformers.__version__, schedule=record.worst_schedule,
        steps_short=fmt_steps(record.steps), max_abs=record.max_abs or 0.0,
        shape=record.shape, config_json=json.dumps(d, default=str), steps=list(record.steps),
        seed=seed, margin=margin, vocab=vocab), encoding="utf-8")
    return path


def write_leak(record: Record, config: dict, path: Path, seed: int, vocab: int, margin: float) -> Path:
    """The reproducer of a full pass that leaks future tokens (`causal`): the check's own probes,
    from its record's `steps` (the positions kept, then the tokens removed or changed)."""
    import transformers

    born, (kept, changed) = str(record.born_at or ""), record.steps
    path.write_text(LEAK_TEMPLATE.format(
        model_type=record.model_type, model_class=record.model_class or "?",
        version=transformers.__version__, changed=changed, total=kept + changed,
        how="removed or changed", max_abs=record.max_abs or 0.0,
        first=born.rpartition("@")[2] or "?", config_json=json.dumps(config, default=str), vocab=vocab,
        seed=seed, margin=margin), encoding="utf-8")
    return path


def run(path: Path, timeout: float = 300.0) -> tuple[int, str]:
    """(exit status, last line of output) of a reproducer in an isolated Python."""
    try:
        p = subprocess.run([sys.executable, "-I", str(path)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout:g} s"
    lines = (p.stdout.strip() or p.stderr.strip()).splitlines()
    return p.returncode, lines[-1] if lines else ""


GROUP_LINE = "The same code breaks: "


def note_group(path: Path, others) -> None:
    """A root cause's one reproducer (`groups`) names the other architectures it breaks, in its
    docstring (rewritten, not added twice, when a scan runs again)."""
    text = Path(path).read_text(encoding="utf-8")
    head, sep, rest = text.partition('\n"""\n')
    if not sep:
        return
    head = "\n".join(x for x in head.split("\n") if not x.startswith(GROUP_LINE))
    if others:
        head += f"\n{GROUP_LINE}{', '.join(others)} (each with its own reproducer beside this one)."
    Path(path).write_text(head + sep + rest, encoding="utf-8")
