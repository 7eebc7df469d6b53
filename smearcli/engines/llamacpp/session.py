"""The census on llama.cpp (`smearcli scan --engine llamacpp`), the engine in one module: every
architecture llama.cpp's converter registers that transformers has a causal-LM class for, each on
the census's tiny config, run by llama.cpp under its schedules against the same weights' full pass
in transformers.

- `names_for(python)`: the model types (the converter's registry, `worker.py archs` in llama.cpp's
  environment, mapped to transformers model types by `reference.model_types`, the census's rule
  for an engine's architecture names);
- `check(model_type, python, ...)`: one architecture's record. The tiny config is the census's
  (`derive.derive`), built seeded at the first init of `reference.INIT_LADDER` that shows power on
  transformers' side (as the census on vLLM does); the model is saved as safetensors and
  `engines.llamacpp.LlamaCppRunner` converts it to a float32 GGUF (synthetic vocabulary of the
  config's `vocab_size`) and runs prefill, ubatch (n_ubatch around the conv width and odd ones),
  chunked, decode, prefix (`seq_cp`), rollback (`seq_rm`), batched, restore, swa, mixed, split,
  shift (`seq_add`) and flash (its cached path held to its own flash-attention one-call prefill),
  KV cache in float32, one worker process per model with its watchdog. `compare.compare` measures every run against the
  transformers full pass with the float64 floor and `smearcli.judging.judge` gives the word, as for
  `compare --impl llamacpp`; `engines.llamacpp.own_prefill` holds every cached path to llama.cpp's
  own one-call prefill:
  * llama.cpp has no float64: a departure is `unconfirmed`, never `bug`;
  * a departure already in the one-call prefill is the implementation's (its kernels, its
    conversion), said so in the reason: not a cache finding;
  * a cached path past the threshold against that prefill (and against transformers) is the
    finding: `shape` names the kind of boundary and `born_at` the first position;
  * what the converter or llama.cpp's loader refuses is `not built` with the reason; a partial
    `seq_rm` llama.cpp refuses on recurrent memory (its documented limit) is the rollback
    schedule's `unsupported`, not a crash; a worker that dies is `crashed` with llama.cpp's frame.
- `Session` / `open_session`: the engine as `census.engines` runs it (registered as "llamacpp" by
  the folder's `registration`; `isolate.census` checks each architecture in its own forked process,
  `--timeout`);
- `summary(records, wall_s)`: the benchmark (conversion, load, runs); `sections(records, meta)`: the
  page under the title `report.markdown` gives it.

- a reproducer per finding: `write(record, entry, tokens, threshold, gguf_name, path)` writes one
  Python file that needs llama.cpp's environment only (llama-cpp-python's low-level bindings and
  numpy; never smearcli, never transformers) and the float32 GGUF the census converted, kept beside
  it. It runs llama.cpp's own one-call prefill and the failing schedule (micro-batches of one width
  inside one call, successive calls, one call per token, a prefix copied with
  `llama_memory_seq_cp`, drafts removed with `llama_memory_seq_rm`, two sequences in one call),
  prints how far the schedule's log-probabilities are from that prefill's per position, and exits 1
  while the bug is there (past the census's threshold, or llama.cpp dies inside the schedule: the
  schedule runs in a child process), 0 once fixed, 2 when nothing could be run. `attach(...)`
  writes it with its GGUF and runs it once in llama.cpp's interpreter isolated (`-I`), so the
  record holds its path and exit status.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from ...judging import judge
from ...util.defaults import NOISE_MARGIN
from ...judging.verdicts import BUG, CRASHED, NOT_BUILT, OK, TIE_ARTIFACT, UNCONFIRMED, UNSUPPORTED, Verdict
from ...census import known
from ...tiny import derive
from ...tiny.derive import text_config
from ...census import measured
from ...census.measured import Ran
from ...census.record import Record, ScheduleResult, new as record
from .data import LlamaCppData
from ...census.report import cell, sort_key
from ..transformers.reference import NO_POWER_NOTE, init_note, model_types, prepared, stamp

T = 48  # tokens: room for micro-batches of 3 to 7, three 16-token calls and drafts of the default size
ENGINE = "llamacpp"
THREADS = 1  # llama.cpp's threads per model: its workers spin while they wait, so on a loaded machine two
# threads made one tiny model's schedules take 67 s instead of 7 s (load 8, 2 cores); --jobs runs models side by side
# the boundary each of llama.cpp's cached paths crosses, in words (a finding's shape)
BOUNDARY = {"ubatch": "a micro-batch boundary inside one llama_decode (n_ubatch)",
            "chunked": "a boundary between successive llama_decode calls",
            "decode": "one llama_decode call per token",
            "prefix": "a sequence continued after llama_memory_seq_cp",
            "rollback": "a sequence continued after llama_memory_seq_rm of rejected drafts",
            "batched": "two sequences of different lengths in one llama_decode call",
            "restore": "a sequence continued in a fresh context after llama_state_seq_save_file and _load_file",
            "swa": "a boundary between llama_decode calls, the sliding-window layers keeping only their window",
            "mixed": "a sequence continued after llama_memory_seq_rm of drafts and of one-token steps removed whole",
            "split": "two sequences of different lengths in one llama_decode call, the cache not unified",
            "shift": "a sequence continued after llama_memory_seq_add moved its cached positions",
            "flash": "a boundary between successive llama_decode calls, flash attention on"}
FINDING = "cache finding"
OWN = "the implementation's own departure, not a cache finding"
# what a departure is, as the record's engine data says it (`llamacpp.departure`): the page and the
# census read this field, never the reason's words
CACHE, IMPLEMENTATION = "cache", "implementation"


def names_for(python: str) -> list[str]:
    """Every model type this census can check: the converter's architectures with a
    transformers causal-LM class."""
    from .environment import archs

    return model_types(archs(python))


# what a setting the tiny config takes is, against llama.cpp (`Carried.kind`)
HARD_CODED = "hard-coded by llama.cpp"  # llama.cpp or its converter fixes it; released checkpoints agree
NOT_CARRIED = "not carried"  # an option of the config that GGUF has no key for: llama.cpp cannot run it
CONVERTER_DEFECT = "converter defect"  # the converter writes the wrong value (a reproducer and a draft in docs/)
IMPLEMENTATION_DIFFERENCE = "implementation difference"  # llama.cpp computes it otherwise, by its own choice


@dataclass(frozen=True)
class Carried:
    """A setting the tiny config takes so that its run says something about llama.cpp's cache, with
    what it is (`kind`): what llama.cpp or its converter hard-codes where the config class's default
    differs (a default llama.cpp cannot run does not decide the verdict), or the value under which
    an option llama.cpp does not carry, a converter defect or an implementation difference has no
    effect. The config class's defaults are rerun beside it: that rerun shows the departure, said in
    a note and in the record (`llamacpp.carried`)."""
    settings: dict  # config key -> the value taken (a key the config class lacks is written all the same)
    layers: Optional[int]  # the layers a pattern llama.cpp hard-codes needs (one whole period), or None
    where: str  # where llama.cpp or its converter says so
    kind: str = HARD_CODED


LLAMA4 = Carried({"attention_chunk_size": 8192}, 4,
                 "llama.cpp hard-codes llama4's attention chunk at 8192 tokens, three chunked layers then one full "
                 "layer, and no rotary embedding on every fourth layer (src/models/llama4.cpp: n_swa 8192, "
                 "load_swa_pattern(ml, 4), n_no_rope_layer_step); the converter writes none of these")
CARRIED = {
    "mistral": Carried({"sliding_window": None}, None,
                       "the converter converts mistral as llama and writes no sliding window "
                       "(conversion/__init__.py: MistralForCausalLM -> llama); the released Mistral-7B-v0.2 and "
                       "v0.3 set sliding_window null"),
    "qwen3_moe": Carried({"norm_topk_prob": True}, None,
                         "llama.cpp always renormalises the chosen experts' weights for qwen3moe "
                         "(src/models/qwen3moe.cpp: build_moe_ffn's norm_w true)"),
    "llama4": LLAMA4,
    "llama4_text": LLAMA4,
    "exaone4": Carried({"sliding_window": None, "layer_types": ["full_attention", "full_attention"]}, None,
                       "llama.cpp uses sliding windows, and drops the rotary embedding of the global layers, only "
                       "at 64 layers (src/models/exaone4.cpp, n_layer() == 64), the 32B's shape; every other "
                       "depth runs full attention with rotary embedding everywhere, as the released 1.2B sets "
                       "(all layers full_attention)"),
    "laguna": Carried({"sliding_window": 0}, None,
                      "with a window in the GGUF llama.cpp forces a period-4 pattern, full attention on every "
                      "fourth layer (src/models/laguna.cpp), and the converter writes the window but not "
                      "layer_types (conversion/laguna.py); the config class's default sets a window with every "
                      "layer full, a pair no released checkpoint has"),
    "smollm3": Carried({}, 4,
                       "llama.cpp drops the rotary embedding on every fourth layer (src/models/smollm3.cpp) and "
                       "the converter does not carry no_rope_layers (conversion/llama.py); SmolLM3-3B drops it on "
                       "one layer in four: the tiny config keeps one whole period"),
    "deepseek_v3": Carried({"scoring_func": "sigmoid"}, None,
                           "transformers fixes DeepSeek-V3's router at sigmoid in code and its config class has no "
                           "scoring_func; the converter writes the gating function only when config.json names it "
                           "(conversion/base.py) and llama.cpp falls back to softmax (src/models/deepseek2.cpp); "
                           "the released DeepSeek-V3 config sets scoring_func sigmoid"),
    "afmoe": Carried({"mup_enabled": True, "route_norm": True}, 4,
                     "llama.cpp hard-codes afmoe's period-4 pattern of sliding and rope-less layers "
                     "(src/models/afmoe.cpp), always scales the embedding by sqrt(n_embd) (transformers only "
                     "with mup_enabled) and normalises the routing weights only when config.json has route_norm "
                     "(conversion/afmoe.py), which transformers' config class lacks; Trinity-Mini sets both"),
    "solar_open": Carried({"rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default",
                                               "partial_rotary_factor": 1.0}}, None,
                          "the converter takes GLM-4.5's half-head rotary default when partial_rotary_factor is "
                          "absent (conversion/glm.py) where transformers rotates the whole head; the released "
                          "Solar-Open-100B sets partial_rotary_factor 1.0, which the converter carries"),
    "falcon_mamba": Carried({"mixer_rms_eps": 1e-05}, None,
                            "transformers normalises dt, B and C with mixer_rms_eps (1e-6) and the layers with "
                            "layer_norm_epsilon (1e-5); GGUF has no key for the first and llama.cpp uses the "
                            "layer epsilon for both (src/models/mamba-base.cpp): the tiny config makes them equal",
                            NOT_CARRIED),
    "gpt_oss": Carried({"rope_parameters": {"rope_type": "default", "rope_theta": 150000.0}}, None,
                       "ggml always rounds YaRN's correction range to whole dimensions (ggml.c, "
                       "ggml_rope_yarn_corr_dims) where transformers honours gpt-oss's truncate false; without "
                       "YaRN the two agree", IMPLEMENTATION_DIFFERENCE),
    "bamba": Carried({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                          "partial_rotary_factor": 1.0}}, None,
                     "the converter un-permutes q and k over the whole head instead of the rotary part "
                     "(conversion/llama.py) and writes the whole head as rope.dimension_count, never reading "
                     "rope_parameters.partial_rotary_factor (conversion/granite.py); every Bamba release rotates "
                     "half the head (docs/llamacpp-defects/bamba.md)", CONVERTER_DEFECT),
    "glm": Carried({"rms_norm_eps": 1e-05}, None,
                   "GlmForCausalLM is converted as ChatGLM, reading ChatGLM's keys: the norm epsilon from "
                   "layernorm_epsilon (1e-5 when absent, conversion/chatglm.py), the rotary base fixed at 10000 "
                   "and the context length from the hidden size (docs/llamacpp-defects/glm.md)", CONVERTER_DEFECT),
    "mellum": Carried({"sliding_window": None}, None,
                      "the converter writes the sliding window whenever use_sliding_window is absent "
                      "(conversion/mellum.py) and llama.cpp then asserts that some layer slides "
                      "(src/llama-model.cpp: GGML_ASSERT(hparams.is_swa_any())) (docs/llamacpp-defects/mellum.md)",
                      CONVERTER_DEFECT),
}


def check(model_type: str, python: str, timeout: float = 240.0, seed: int = 0, tolerance: float = NOISE_MARGIN,
          repro_dir: Optional[Path] = None, threads: int = THREADS) -> Record:
    """One architecture's record (the module docstring says how it is judged); the llama.cpp worker
    is ended `timeout` - 15 s after the start at the latest. Where llama.cpp hard-codes what the
    config class's default sets otherwise (`CARRIED`), the record is the run on llama.cpp's values,
    and the default's run is said in a note and in `llamacpp.carried`."""
    carried = CARRIED.get(model_type)
    t0 = time.monotonic()
    got = derive.derive(model_type) if carried is None else derive.derive(model_type, carried.settings, carried.layers)
    rec = checked(model_type, got, python, timeout if carried is None else timeout / 2, seed, tolerance, repro_dir,
                  threads)
    if departure(rec) == CACHE:  # a cache finding: rerun before it is one
        rec = replicate(model_type, got, rec, python, timeout - (time.monotonic() - t0), seed, tolerance, threads)
    if carried is None:
        return rec
    left = timeout - (time.monotonic() - t0)
    said = ", ".join([f"{k} {v}" for k, v in carried.settings.items()]
                     + ([f"the first {carried.layers} layers of the default's pattern"] if carried.layers else []))
    entry = {"settings": {k: v for k, v in carried.settings.items()}, "layers": carried.layers,
             "where": carried.where, "kind": carried.kind}
    if left < 45:
        rec.notes.append(f"{carried.kind}: the tiny config takes {said} ({carried.where}); the config class's "
                         "defaults were not rerun: no time left")
    else:
        default = checked(model_type, derive.derive(model_type), python, left, seed, tolerance, None, threads)
        entry["default"] = {"verdict": default.verdict, "worst_schedule": default.worst_schedule,
                            "max_abs": default.max_abs, "reason": default.reason}
        rec.notes.append(f"{carried.kind}: the tiny config takes {said} ({carried.where}); with the config "
                         f"class's defaults it is {default.verdict}"
                         + (f" ({str(default.reason)[:240]})" if default.reason else ""))
    rec.llamacpp = (rec.llamacpp or LlamaCppData()).but(carried=entry)
    return rec


NOT_REPLICATED = "not replicated"  # `llamacpp.departure` of a cache finding a rerun did not show again


def replicate(model_type: str, got, rec: Record, python: str, left: float, seed: int, tolerance: float,
              threads: int) -> Record:
    """A cache finding run again before it is one, as the transformers census replicates a bug
    (`engines.transformers.ties`), the judge deciding (`judge.replicated`, the finding's word being
    `unconfirmed`: llama.cpp has no float64): on the next seed (weights and tokens), then at the
    head and expert counts the derivation shrank restored (`derive.default_counts`). A rerun keeps
    the finding when the same schedule departs from llama.cpp's own one-call prefill again, and a
    rerun that crashes or is not built refutes nothing. Ties: the top-k calls with an exact tie at
    their edge in the transformers reference's pass over the same weights and tokens
    (`topk.watching`): an exact tie (an indexer's ReLU at exactly zero) is exact in llama.cpp too,
    where a kernel's order then picks among the tied keys. A finding that does not stand is a `tie
    artifact` where ties were seen, else its departure is `not replicated`."""

    t0 = time.monotonic()
    ties = ties_in(rec)

    def kept(rerun: Record) -> str:  # the rerun's word as a replication reads it: the same departure at its schedule?
        same = departure(rerun) == CACHE and rerun.worst_schedule == rec.worst_schedule
        return str(judge.read_again(same, Verdict(rec.verdict), rerun.verdict))

    def brief(rerun: Record) -> dict:
        return {"verdict": rerun.verdict, "worst_schedule": rerun.worst_schedule, "max_abs": rerun.max_abs,
                "departure": departure(rerun)}

    rep: dict = {"ties": ties}
    word, why = None, ""
    budget = (left - 15.0) / 2
    if budget < 20:
        rec.notes.append("not replicated: no time left for a rerun")
        return rec
    other = checked(model_type, got, python, budget, seed + 1, tolerance, None, threads)
    rep.update(seed=seed + 1, second_seed=brief(other))
    ties += ties_in(other)
    word = judge.replicated(judge.SECOND_SEED, kept(other), bool(ties), finding=UNCONFIRMED)
    why = f"on seed {seed + 1} (weights and tokens) {rec.worst_schedule} " + (
        "departs again" if kept(other) == rec.verdict else f"gives {kept(other)}")
    said = [why]  # each rerun that kept it
    counts = derive.default_counts(got.config, got.changed, derive.parameters, T) if got.changed else None
    if word is None and counts is not None:
        rep["default_counts"] = counts.entry()
        if counts.config is not None and left - (time.monotonic() - t0) > 35:
            at = checked(model_type, derive.Derived(model_type, counts.config, None, got.changed), python,
                         left - (time.monotonic() - t0) - 15.0, seed, tolerance, None, threads)
            rep["default_counts"]["rerun"] = brief(at)
            ties += ties_in(at)
            word = judge.replicated(judge.DEFAULT_COUNTS, kept(at), bool(ties), finding=UNCONFIRMED)
            why = f"at the default head/expert counts ({counts.words()}) {rec.worst_schedule} " + (
                "departs again" if kept(at) == rec.verdict else f"gives {kept(at)}")
            said.append(why)
            if at.verdict in (str(CRASHED), str(NOT_BUILT)):  # all at once cannot run: each kind of count alone
                for what, words, cfg in one_count_each(got, counts):
                    if left - (time.monotonic() - t0) < 35:
                        break
                    alone = checked(model_type, derive.Derived(model_type, cfg, None, got.changed), python,
                                    left - (time.monotonic() - t0) - 15.0, seed, tolerance, None, threads)
                    rep["default_counts"].setdefault("alone", {})[what] = brief(alone)
                    ties += ties_in(alone)
                    word = judge.replicated(judge.DEFAULT_COUNTS, kept(alone), bool(ties), finding=UNCONFIRMED)
                    if word is not None:
                        why = (f"at the default {what} alone ({words}) {rec.worst_schedule} gives {kept(alone)} "
                               f"(all the default counts at once: {at.verdict})")
                        break
    rep["ties"] = ties
    rec.replication = rep
    if word in (TIE_ARTIFACT, UNCONFIRMED):
        rec.reason = f"{NOT_REPLICATED}: {why}; " + str(rec.reason or "")
    if word == TIE_ARTIFACT:
        rec.verdict = str(word)
        rec.llamacpp = (rec.llamacpp or LlamaCppData()).but(departure=NOT_REPLICATED)
        rec.notes.append(f"a tie artifact: the transformers reference's pass had {ties} top-k call(s) with an exact "
                         f"tie at the edge of the choice; {why}")
    elif word == UNCONFIRMED:
        rec.llamacpp = (rec.llamacpp or LlamaCppData()).but(departure=NOT_REPLICATED)
        rec.notes.append("not replicated: " + why)
    else:
        more = _counts_note(rep, counts)
        rec.notes.append("replicated: " + "; ".join(said) + (f"; {more}" if more else ""))
    return rec


def one_count_each(got, counts) -> list:
    """[(what, "key tiny -> default", config)]: the tiny config with one kind of count the
    derivation shrank (`derive.COUNTS`: attention heads, experts, indexer heads...) restored alone."""
    out = []
    for what, keys in derive.shrunk_counts(got.changed).items():
        back = {k: default for k, (default, _) in keys.items() if k in counts.restored}
        if not back:
            continue
        try:
            cfg = derive.rebuilt(got.config, back)
        except Exception:  # the config class refuses this count alone: not a rerun to make
            continue
        out.append((what, ", ".join(f"{k} {keys[k][1]} -> {v}" for k, v in back.items()), cfg))
    return out


def _counts_note(rep: dict, counts) -> str:
    """What the default counts gave where the second seed already kept the finding."""
    entry = rep.get("default_counts")
    if counts is None:
        return "no head or expert count was shrunk"
    if not entry or "rerun" not in entry:
        skipped = "; ".join(f"{k} not restored: {v}" for k, v in (entry or {}).get("skipped", {}).items())
        return "not rerun at the default head/expert counts" + (f" ({skipped})" if skipped else "")
    return ""


def checked(model_type: str, got, python: str, timeout: float, seed: int, tolerance: float,
            repro_dir: Optional[Path], threads: int) -> Record:
    """The record of one derived config (`derive.Derived`), as `check` describes."""
    t0 = time.monotonic()
    base = dict(engine=ENGINE)
    if got.error:
        return record(model_type, judge.stopped(judge.DERIVE), reason=got.error, **base)
    config = got.config
    text = text_config(config)
    vocab = int(getattr(text, "vocab_size", 0) or 0)
    if vocab < 2:
        return record(model_type, judge.stopped(judge.DERIVE), reason="the tiny config has no vocab_size for llama.cpp's vocabulary",
                      **base)
    with prepared(model_type, config, got.summary(), T, seed, tolerance, f"smearcli-llamacpp-{model_type}-") as p:
        base.update(p.fields)
        if p.stop:
            return record(model_type, judge.stopped(p.stop), reason=p.why, **base)
        d, init = p.directory, p.got.init
        gguf = d / "model.gguf"
        from ...measure import topk

        with topk.watching() as seen:  # the transformers reference's top-k calls: the only ones in this process
            rec, finding, c, runner = judged(model_type, p.got.model, d / "model", python, p.tokens, p.got.runner,
                                            p.got.power, tolerance, base,
                                            max(30.0, timeout - 15.0 - (time.monotonic() - t0)), threads, gguf)
        if seen.ties:
            rec.llamacpp = (rec.llamacpp or LlamaCppData()).but(ties=int(seen.ties))
            word = judge.own_tie(rec.verdict, seen.ties, departure(rec) == IMPLEMENTATION)
            if word == TIE_ARTIFACT:  # exact ties in a choice llama.cpp breaks by its own order
                rec.verdict = str(word)
                rec.notes.append(f"a tie artifact: the transformers reference's pass had {seen.ties} top-k call(s) "
                                 "with an exact tie at the edge of the choice (a router scoring experts alike), which "
                                 "llama.cpp breaks by its own order: its one-call prefill's departure is that choice")
        if rec.reason:  # the converter names files in the temporary directory: not the record's business
            for spelt in {str(d.resolve()), str(d)}:  # the worker is sent the resolved path
                rec.reason = str(rec.reason).replace(spelt, "MODEL_DIR")
        if init is not None and rec.verdict == str(OK):
            rec.notes.append(init_note(init))
        if repro_dir is not None and finding and gguf.is_file():
            try:
                attach(rec, c, runner, gguf, Path(repro_dir), python)
            except OSError as e:  # the finding stands; its reproducer could not be written
                rec.reproducer_output = f"the reproducer was not written: {e.strerror or e}"
    return rec


def judged(model_type, model, model_dir: Path, python: str, tokens, ref_runner, power, tolerance, base,
           timeout_s: float, threads: int, gguf: Path):
    """(the record, whether it is a finding to reproduce, the comparison or None, the runner):
    llama.cpp's runs measured by `compare.compare` and judged by `smearcli.judging.judge`, then held to
    llama.cpp's own prefill."""
    from ...measure import compare
    from ...util.errors import UserError
    from . import implementation as llamacpp
    from .own_prefill import against_prefill
    from ...measure.steps import ScheduleOptions

    settings = llamacpp.Settings(python=python, model=str(model_dir), vocab=int(text_config(model.config).vocab_size),
                                 widths=llamacpp.widths_for(text_config(model.config), T), f16_too=True,
                                 threads=threads, timeout_s=timeout_s, stuck_s=min(120.0, timeout_s),
                                 keep_gguf=str(gguf))
    runner = llamacpp.LlamaCppRunner(settings)
    opts = ScheduleOptions()
    try:
        c = compare.compare([runner], tokens, runner.schedules, options=opts, tolerance=tolerance,
                            reference=ref_runner, power=False)
    except UserError as e:  # the environment's answer outside the protocol: not the model's
        return record(model_type, judge.stopped(judge.WORKER), reason=f"llama.cpp's worker: {e}", llamacpp=timing(runner), **base), \
            False, None, runner
    res = runner.result or {}
    if res.get("not_built"):
        return record(model_type, judge.stopped(judge.ENGINE), reason="llama.cpp: " + res["not_built"], llamacpp=timing(runner),
                      **base), False, None, runner
    c.power = power
    own = against_prefill(c, runner.label, runner.spread)
    by_name = {d.schedule: d for d in own.runs}
    ran = [Ran(r.schedule, list(r.steps), m, c.confirmation(m),
               extra={} if r.schedule not in by_name else dict(vs_prefill=by_name[r.schedule].max_abs,
                                                                first=by_name[r.schedule].first))
           for r, m in zip(c.runs, c.metrics)]
    # checking nothing is llama.cpp's documented refusal (a partial seq_rm on recurrent memory)
    ran += [Ran(r.schedule, list(r.steps), outcome=judge.DECLARED if r.outcome == judge.CHECKED_NOTHING else r.outcome,
                why=r.message) for r in c.unmeasured]
    verdict = measured.judged(ran, power, c.inconclusive)
    word = verdict.word
    schedules = measured.entries(ran, verdict)
    notes = [n for n in runner.notes() if not n.startswith("ubatch")] + own.lines()
    notes += [f"ubatch widths: {n.split(';', 1)[1].strip()}" for n in runner.notes() if n.startswith("ubatch")]
    notes += [f"{n}: {s.why}" for n, s in schedules.items() if s.status == str(UNSUPPORTED)]
    failed = verdict.named(BUG, UNCONFIRMED)
    found = [d for d in own.findings if d.schedule in failed]
    out = dict(base, schedules=schedules, notes=notes, llamacpp=timing(runner))
    if word is CRASHED:
        return record(model_type, word, **measured.verdict_fields(ran, verdict, power), **out), True, c, runner
    if found:
        worst = max(found, key=lambda d: d.max_abs)
        out["llamacpp"] = out["llamacpp"].but(departure=CACHE)
        return record(model_type, word, **measured.verdict_fields(ran, verdict, power, [worst.schedule]),
                      shape=BOUNDARY.get(worst.schedule, worst.schedule)
                      + (", first at one of the run's boundaries" if worst.at_boundary else ""),
                      born_at=f"logits@{worst.first}",
                      reason=f"{FINDING}: {worst.schedule} departs from llama.cpp's own one-call prefill by "
                             f"{worst.max_abs:.3g} from position {worst.first} (threshold {own.threshold:.3g}); "
                             + (f"that prefill itself departs from transformers by {own.prefill_max:.3g} (the "
                                "implementation's); " if own.prefill_departs else "")
                             + "llama.cpp has no float64 to confirm it in",
                      **out), True, c, runner
    prefill = own.prefill_departs and any(r.schedule == "prefill" and r.metrics is not None for r in ran)
    fields = measured.verdict_fields(ran, verdict, power, ["prefill"] if prefill else failed)
    if word is UNCONFIRMED and own.prefill_departs:
        out["llamacpp"] = out["llamacpp"].but(departure=IMPLEMENTATION)
        fields["reason"] = (f"{OWN}: llama.cpp's one-call prefill departs from transformers by {own.prefill_max:.3g} "
                            f"and every cached path matches that prefill within {own.threshold:.3g}")
    elif word is UNCONFIRMED:
        fields["reason"] = "a cached path departs from transformers, not from llama.cpp's own one-call prefill"
    elif word is not OK:
        fields["reason"] = verdict.why
        if power is not None and power.measured:
            notes.append(NO_POWER_NOTE)
    return record(model_type, word, **fields, **out), False, c, runner


def ties_in(rec: Record) -> int:
    """The exact ties at the edge of a top-k that `rec`'s check saw in the reference's pass."""
    return int(rec.llamacpp.ties or 0) if rec.llamacpp is not None else 0


def timing(runner) -> LlamaCppData:
    """What the record keeps of llama.cpp's side: its version, the GGUF, the times (the benchmark's)."""
    r = runner.result or {}
    conv = r.get("convert") or {}
    return LlamaCppData(
        llama_cpp_python=r.get("llama_cpp_python"), arch=conv.get("arch"),
        gguf_mb=round(conv.get("bytes", 0) / 1e6, 2) if conv else None, convert_s=conv.get("convert_s"),
        load_s=r.get("load_s"), schedules_s=round(sum(float(e.get("wall_s") or 0) for e in r.get("schedules") or []), 2),
        worker_s=r.get("total_s"), wall_s=r.get("wall_s"), recurrent=r.get("recurrent"), hybrid=r.get("hybrid"),
        deaths=len(r.get("deaths") or []), f16_cache={k: float(f"{v:.3g}") for k, v in runner.f16_moves().items()},
        own_spread=None if runner.spread is None else float(f"{runner.spread:.3g}"))


def summary(recs: Sequence[Record], wall_s: float) -> dict:
    """The benchmark: the census's wall time and llama.cpp's share of it (conversion, load, runs)."""
    ll = [r.llamacpp or LlamaCppData() for r in recs]
    total = (lambda k: round(sum(float(getattr(x, k) or 0) for x in ll), 1))
    return {"wall_s": round(wall_s, 1), "architectures": len(recs), "convert_s": total("convert_s"),
            "load_s": total("load_s"), "runs_s": total("schedules_s"), "worker_wall_s": total("wall_s"),
            "architecture_s": total("wall_s") and round(sum(float(r.wall_s or 0) for r in recs), 1)}


def summary_line(s: dict) -> str:
    return (f"census on llama.cpp: {s['architectures']} architectures in {s['wall_s']:g} s; in llama.cpp's workers "
            f"{s['worker_wall_s']:g} s (converting {s['convert_s']:g} s, loading {s['load_s']:g} s, running the schedules "
            f"{s['runs_s']:g} s, the rest the workers' start: forked by the census's server, or a fresh Python "
            "importing torch and the converter where none runs); "
            f"{s['architecture_s']:g} s in the per-architecture processes (the transformers reference and its float64 "
            "floor included)")


def departure(r: Record) -> Optional[str]:
    """CACHE where a cached path departs from llama.cpp's own one-call prefill, IMPLEMENTATION where
    that prefill itself departs from transformers and the cached paths follow it, else None."""
    return r.llamacpp.departure if r.llamacpp is not None else None


def sections(recs: Sequence[Record], meta: Optional[dict] = None) -> list[str]:
    """The census on llama.cpp's page after its title and count line (`report.markdown` frames it):
    what ran, the benchmark, the cache findings and crashes (with reproducers), the implementation's
    own departures, what was not built and why, then every architecture with its verdict or reason."""
    meta = meta or {}
    version = meta.get("llama_cpp_python") or next((r.llamacpp.llama_cpp_python for r in recs
                                                   if r.llamacpp is not None and r.llamacpp.llama_cpp_python), "?")
    out = [f"llama-cpp-python {version} (CPU build, one thread per model), float32 GGUF, float32 KV cache, {T} "
           "tokens per architecture.", ""]
    b = meta.get("benchmark")
    if b:
        out += [f"Benchmark: {summary_line(b)}" + (f"; load {meta['load']}" if meta.get("load") else "") + ".", ""]
    found = [r for r in sorted(recs, key=sort_key) if departure(r) == CACHE
             or r.verdict == str(CRASHED) or (r.upstream and departure(r) not in (IMPLEMENTATION, NOT_REPLICATED))]
    if found:
        out += ["## Findings", "", "A cached path of llama.cpp past the threshold against its own one-call prefill "
                "(llama.cpp has no float64, so unconfirmed), or a crash with llama.cpp's frame. Each reproducer needs "
                "only llama.cpp's environment and the GGUF beside it, and exits 1 while the bug is there.", "",
                "| architecture | verdict | schedule | shape | first position | reason | upstream | reproducer (exit) |",
                "|---|---|---|---|---|---|---|---|"]
        for r in found:
            rep = f"`{Path(r.reproducer).name}` ({r.reproducer_status})" if r.reproducer else "-"
            out.append(f"| {r.model_type} | {r.verdict} | {r.worst_schedule or '-'} | "
                       f"{cell(r.shape or '-', 160)} | {(r.born_at or '-').split('@')[-1]} | "
                       f"{cell(r.reason, 240)} | {known.cell(r)} | {rep} |")
        out.append("")
    own = [r for r in sorted(recs, key=sort_key) if departure(r) == IMPLEMENTATION]
    if own:
        out += ["## The implementation's own departures", "", "llama.cpp's one-call prefill already departs from "
                "the transformers full pass, and every cached path matches that prefill: its kernels or its "
                "conversion, not its cache.", "", "| architecture | prefill vs transformers | x floor | upstream |",
                "|---|---|---|---|"]
        for r in own:
            p = (r.schedules or {}).get("prefill") or ScheduleResult()
            out.append(f"| {r.model_type} | {p.max_abs or 0:.2g} | {p.multiple or 0:.3g} | {known.cell(r)} |")
        out.append("")
    took = [r for r in sorted(recs, key=lambda r: r.model_type) if r.llamacpp is not None and r.llamacpp.carried]
    if took:
        out += ["## What the tiny config takes, and what the defaults give", "", "Where the config class's "
                "default is one llama.cpp cannot run, or one under which an option llama.cpp does not carry, a "
                "converter defect or an implementation difference decides the comparison, the tiny config takes "
                "the value named (`CARRIED` in `smearcli/engines/llamacpp/session.py`, each with where llama.cpp "
                "says so) and its verdict is that run's; the defaults are rerun beside it, and what they give shows "
                "the departure. Converter defects have a reproducer without smearcli and a draft for llama.cpp in "
                "`docs/llamacpp-defects/`.", "",
                "| architecture | what it is | the tiny config takes | with the defaults | verdict |",
                "|---|---|---|---|---|"]
        for r in took:
            c = r.llamacpp.carried
            taken = ", ".join([f"`{k}` {v}" for k, v in (c.settings or {}).items()]
                              + ([f"{c.layers} layers"] if c.layers else []))
            d = c.default
            said = "not rerun" if d is None else (f"{d.verdict}" + (
                f", prefill {d.max_abs:.2g} off transformers" if d.max_abs is not None else ""))
            out.append(f"| {r.model_type} | {c.kind if c.given('kind') else HARD_CODED} | {cell(taken, 160)} | {cell(said, 120)} | "
                       f"{r.verdict} |")
        out.append("")
    skipped = [r for r in sorted(recs, key=lambda r: r.model_type) if r.verdict == str(NOT_BUILT)]
    if skipped:
        out += ["## Not built", "", "| architecture | why |", "|---|---|"]
        out += [f"| {r.model_type} | {cell(r.reason, 240)} |" for r in skipped]
        out.append("")
    spreads = [(r.llamacpp.own_spread, r.floor or 0.0) for r in recs if r.llamacpp is not None
               and r.llamacpp.own_spread is not None]
    if spreads:
        above = sum(1 for sp, fl in spreads if sp > fl)
        vals = sorted(sp for sp, _ in spreads)
        from .implementation import SPREAD

        lengths = [n for n in SPREAD if n < T]
        out += ["## llama.cpp's own spread", "", "Before its cache is judged, each architecture's row is also run as "
                f"one-call prefills of its first {', '.join(map(str, lengths[:-1]))} and {lengths[-1]} tokens, each "
                "from an empty cache: no "
                "cached path, only llama.cpp's kernels at other batch widths. Their largest distance from the whole "
                "row's one-call prefill is llama.cpp's own spread, and the threshold a cached path must pass is the "
                "tolerance times the larger of it and the float64 floor of the transformers reference. Over "
                f"{len(vals)} architectures it ran from {vals[0]:.2g} to {vals[-1]:.2g} (median "
                f"{vals[len(vals) // 2]:.2g}); it was larger than the float64 floor on {above}"
                + (", where it set the threshold." if above else ", so the floor set every threshold."), ""]
    f16 = {r.model_type: (r.llamacpp or LlamaCppData()).f16_cache or {} for r in recs}
    moved = sorted(v["decode"] for v in f16.values() if "decode" in v)
    if moved:
        out += ["## The float16 cache", "", "The census holds the cache's logic in a float32 cache; llama.cpp's "
                "default cache is float16. Each architecture also ran prefill and decode on the float16 cache, and "
                "the last column of the table below says how far it moves their log-probabilities from the float32 "
                f"cache's: on decode, from {moved[0]:.2g} to {moved[-1]:.2g} over {len(moved)} architectures "
                f"(median {moved[len(moved) // 2]:.2g}). That is the cache's precision, the same on every path, not a "
                "finding: it is the size a user of the default cache sees beside any error this page reports.", ""]
    out += ["## Every architecture", "",
            "| architecture | verdict | worst schedule | error | x floor | rollback | reason or notes | float16 cache "
            "(prefill / decode) |",
            "|---|---|---|---|---|---|---|---|"]
    for r in sorted(recs, key=sort_key):
        err = "-" if r.max_abs is None else f"{r.max_abs:.2g}"
        mult = "-" if r.multiple is None else f"{r.multiple:.2g}"
        rb = ((r.schedules or {}).get("rollback") or ScheduleResult()).status or "-"
        said = r.reason or "; ".join(n for n in r.notes or [] if "one-call prefill against" in n)
        h = f16.get(r.model_type) or {}
        half = " / ".join(f"{h[k]:.2g}" if k in h else "-" for k in ("prefill", "decode")) if h else "-"
        out.append(f"| {r.model_type} | {r.verdict} | {r.worst_schedule or '-'} | {err} | {mult} | "
                   f"{rb} | {cell(said, 160)} | {half} |")
    return out


def load() -> str:
    """The machine's load average (1, 5, 15 minutes): what any time reported here ran beside."""
    import os

    try:
        return "%.1f, %.1f, %.1f" % os.getloadavg()
    except OSError:
        return "?"


class Session:
    """The llama.cpp engine (`census.engines`): its environment checked by the handshake, the
    converter's architectures listed there, each architecture checked with its own worker; the
    benchmark of the run in `meta()`."""

    def __init__(self, python: Optional[str], quiet: bool = False):
        from ...util.errors import UserError
        from .implementation import ENV_PYTHON
        from .environment import hello

        if not python:
            raise UserError(f"the llama.cpp engine needs the Python of llama.cpp's environment (${ENV_PYTHON}); "
                            "scripts/make_env.sh llamacpp DIR makes one (then DIR/bin/python)")
        self.python, self.quiet = python, quiet
        self.hello = hello(python)
        self.names = names_for(python)
        self.t0, self.done = time.monotonic(), []
        self.server = start_server(python, quiet)

    def meta(self) -> dict:
        """llama-cpp-python's version, the benchmark and the load (the benchmark said on stderr unless quiet)."""
        bench, now = summary(self.done, time.monotonic() - self.t0), load()
        if not self.quiet:
            import sys

            sys.stderr.write(f"smearcli: {summary_line(bench)} (load {now})\n")
        return {"engine": ENGINE, "llama_cpp_python": self.hello.get("llama_cpp_python"),
                "llamacpp_python": self.python, "benchmark": bench, "load": now}

    def model_types(self) -> list[str]:
        return list(self.names)

    def check(self, model_type: str, repro_dir: Path, timeout: float, memory: Optional[int]) -> Record:
        return check(model_type, self.python, timeout=timeout, repro_dir=repro_dir)

    def checked(self, rec: Record, more: bool) -> bool:
        self.done.append(rec)
        return False

    def stamp(self) -> dict:
        return stamp()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


open_session = Session


def start_server(python: str, quiet: bool):
    """The census's fork server (`forkserver`), or None where it did not start (said on stderr
    unless quiet: every worker is then a fresh process, slower and as sound)."""
    from .environment import WORKER, worker_env
    from .forkserver import Server

    server = Server(python, str(WORKER), worker_env())
    if server.path is not None:
        return server
    if not quiet:
        import sys

        sys.stderr.write(f"smearcli: llama.cpp's fork server did not start ({server.why}); each worker starts "
                         "afresh\n")
    return None

# -- a reproducer per finding -------------------------------------------------------------------

TEMPLATE = '''"""Reproducer: {model_type} in llama.cpp (llama-cpp-python {version}), CPU, float32 GGUF, float32 KV cache.

Schedule {schedule}: {how}. Found by smearcli's census on llama.cpp: {finding}.
Needs llama.cpp's environment only (llama-cpp-python and numpy) and {gguf} beside this file (the
census's tiny random model, converted at float32). Exit status: 1 while the bug is there (the
schedule's log-probabilities depart from llama.cpp's own one-call prefill by more than THRESHOLD,
or llama.cpp dies inside the schedule), 0 once fixed, 2 when nothing could be run.
"""
import ctypes
import os
import subprocess
import sys

GGUF = os.path.join(os.path.dirname(os.path.abspath(__file__)), {gguf!r})
SCHEDULE = {entry!r}
TOKENS = {tokens!r}
THRESHOLD = {threshold!r}  # the census's tolerance x the float64 noise floor of the transformers full pass
STUCK_S = 120


def child():
    import numpy as np
    import llama_cpp.llama_cpp as L

    quiet = L.llama_log_callback(lambda level, text, data: None)  # kept referenced while llama.cpp may call it
    L.llama_log_set(quiet, None)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(GGUF.encode(), mp)
    if not model:
        print("llama.cpp did not load", GGUF)
        return 2
    V = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    T = len(TOKENS)

    def context(n_batch, n_ubatch, n_seq=1, n_rs_seq=0, unified=True, swa_full=True, flash=False):
        cp = L.llama_context_default_params()
        cp.n_ctx = max(2 * T + 32, 8)
        cp.n_batch, cp.n_ubatch, cp.n_seq_max, cp.n_rs_seq = n_batch, n_ubatch, n_seq, n_rs_seq
        cp.n_threads = cp.n_threads_batch = 1
        cp.type_k = cp.type_v = L.GGML_TYPE_F32  # the cache in float32: the cache's logic, not its precision
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.kv_unified, cp.swa_full = unified, swa_full
        return L.llama_init_from_model(model, cp)

    def decode(ctx, items):
        batch = L.llama_batch_init(len(items), 0, 1)
        batch.n_tokens = len(items)
        for i, (tok, pos, seq) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, pos, 1, 1
            batch.seq_id[i][0] = seq
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {{rc}}")
        out = [np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(V,)).astype(np.float64)
               for i in range(len(items))]
        L.llama_batch_free(batch)
        return out

    items = [(t, p, 0) for p, t in enumerate(TOKENS)]
    name = SCHEDULE["name"]
    ctx = context(T, T, flash=name == "flash")  # flash: held to its own one-call prefill, flash attention on
    one_call = np.stack(decode(ctx, items))
    L.llama_free(ctx)
    if name in ("prefill", "ubatch", "chunked", "decode", "swa", "flash"):  # prefill: dying in its one call (above)
        sizes = SCHEDULE.get("sizes") or ([1] * T if name == "decode" else [T])
        ctx = context(T if name == "ubatch" else max(sizes), SCHEDULE.get("width") or max(sizes),
                      swa_full=name != "swa", flash=name == "flash")
        got, pos = [], 0
        for n in sizes:
            got += decode(ctx, items[pos:pos + n])
            pos += n
    elif name == "prefix":
        P = SCHEDULE["prefix"]
        ctx = context(T, T, n_seq=2)
        got = decode(ctx, items[:P])
        L.llama_memory_seq_cp(L.llama_get_memory(ctx), 0, 1, -1, -1)
        got += decode(ctx, [(t, p, 1) for t, p, _ in items[P:]])
    elif name in ("rollback", "mixed"):  # mixed: a one-token step taken back whole between the drafts
        k, j, prompt = SCHEDULE["draft"], SCHEDULE["reject"], SCHEDULE["prompt"]
        ctx = context(max(prompt, k), max(prompt, k), n_rs_seq=k)
        got, pos, step = decode(ctx, items[:prompt]), prompt, 1
        while pos < T:
            single = name == "mixed" and step % 2 == 0  # a one-token step taken back whole
            step += 1
            n = 1 if single else min(k, T - pos)
            keep = 0 if single else n if n < k else n - j
            draft = TOKENS[pos:pos + keep] + [(t + 1) % V for t in TOKENS[pos + keep:pos + n]]
            got += decode(ctx, [(t, pos + i, 0) for i, t in enumerate(draft)])[:keep]
            if keep < n and not L.llama_memory_seq_rm(L.llama_get_memory(ctx), 0, pos + keep, -1):
                print("llama_memory_seq_rm refused the partial removal: its documented limit, nothing checked")
                return 2
            pos += keep
    elif name == "shift":  # decoded at positions moved up, the cache moved back, the rest after
        P, k = SCHEDULE["prefix"], SCHEDULE["offset"]
        ctx = context(T, T)
        if not L.llama_memory_can_shift(L.llama_get_memory(ctx)):
            print("llama_memory_can_shift says this memory cannot shift: its documented limit, nothing checked")
            return 2
        got = decode(ctx, [(t, p + k, s) for t, p, s in items[:P]])
        L.llama_memory_seq_add(L.llama_get_memory(ctx), 0, -1, -1, -k)
        got += decode(ctx, items[P:])
    elif name == "restore":  # a saved slot restored into a fresh context, as a server does
        P = SCHEDULE["prefix"]
        ctx = context(T, T)
        got = decode(ctx, items[:P])
        path = os.path.abspath(__file__) + ".state"
        wrote = L.llama_state_seq_save_file(ctx, path.encode(), 0, (ctypes.c_int32 * P)(*TOKENS[:P]), P)
        L.llama_free(ctx)
        if not wrote or os.path.getsize(path) != wrote:
            print("the state file was not written whole: nothing checked")
            return 2
        ctx = context(T, T)
        ids, n_ids = (ctypes.c_int32 * T)(), ctypes.c_size_t(0)
        read = L.llama_state_seq_load_file(ctx, path.encode(), 0, ids, T, ctypes.byref(n_ids))
        os.remove(path)
        if read != wrote:
            print(f"llama_state_seq_load_file read {{read}} of the {{wrote}} bytes saved")
            print("the bug is there")
            return 1
        got += decode(ctx, items[P:])
    elif name in ("batched", "split"):  # the long sequence, then the short one: each held to the one call's
        S = SCHEDULE["short"]  # positions; split: in a cache that is not unified
        ctx = context(T + S, T + S, n_seq=2, unified=name == "batched")
        got = decode(ctx, items + [(t, p, 1) for t, p, _ in items[:S]])
        one_call = np.concatenate([one_call, one_call[:S]])
    else:
        print("unknown schedule", name)
        return 2
    L.llama_free(ctx)

    def logprobs(a):
        a = a - a.max(axis=-1, keepdims=True)
        return a - np.log(np.exp(a).sum(axis=-1, keepdims=True))
    diff = np.abs(logprobs(np.stack(got)) - logprobs(one_call)).max(axis=-1)
    beyond = np.nonzero(diff > THRESHOLD)[0]
    where = [("the second sequence's " if i >= T else "") + f"position {{i % T}}" for i in beyond[:1]]
    print(f"{{name}} against llama.cpp's one-call prefill: max |d log-prob| {{diff.max():.3g}} (threshold "
          f"{{THRESHOLD:.3g}})" + (f", first past it at {{where[0]}}" if where else ""))
    print("the bug is there" if len(beyond) else "no bug: the schedule matches the one-call prefill")
    return 1 if len(beyond) else 0


def main():
    try:
        import llama_cpp  # noqa: F401
    except ImportError as e:  # not llama.cpp's environment: nothing was reproduced (exit 2, not the bug's 1)
        print(f"run this with the Python of llama.cpp's environment ({{e}})", file=sys.stderr)
        return 2
    print(f"{model_type}: {{SCHEDULE}}, {{len(TOKENS)}} tokens, {{GGUF}}")
    try:  # the schedule in a child: llama.cpp aborting or crashing in it is the bug too
        p = subprocess.run([sys.executable, "-I", os.path.abspath(__file__), "child"], timeout=STUCK_S,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except subprocess.TimeoutExpired:
        print(f"llama.cpp did not finish the schedule in {{STUCK_S}} s")
        print("the bug is there")
        return 1
    sys.stdout.write(p.stdout)
    if p.returncode in (0, 1, 2):
        return p.returncode
    said = [ln for ln in p.stderr.splitlines() if ln.strip()]
    print(f"llama.cpp died in the schedule (status {{p.returncode}})" + (f": {{said[-1][:300]}}" if said else ""))
    print("the bug is there")
    return 1


if __name__ == "__main__":
    sys.exit(child() if sys.argv[1:] == ["child"] else main())
'''
HOW = {"prefill": "llama.cpp's own one-call prefill (one llama_decode of the whole row)",
       "ubatch": "one llama_decode call whose prompt llama.cpp splits into micro-batches of n_ubatch",
       "chunked": "successive llama_decode calls of the sizes given",
       "decode": "one llama_decode call per token",
       "prefix": "a prefix on sequence 0 copied to sequence 1 (llama_memory_seq_cp), the rest decoded on sequence 1",
       "rollback": "drafts whose rejected tokens are removed (llama_memory_seq_rm) and decoded right",
       "batched": "the row and its first tokens as two sequences of one llama_decode call",
       "split": "the row and its first tokens as two sequences of one llama_decode call, in a cache that is not "
                "unified (kv_unified off, llama.cpp's default)",
       "swa": "successive llama_decode calls with swa_full off: the sliding-window layers keep only their window",
       "mixed": "drafts whose rejected tokens are removed (llama_memory_seq_rm), and between them a one-token step "
                "removed whole before the next draft redoes its position",
       "restore": "a prefix decoded, its state saved to a file (llama_state_seq_save_file), loaded into a fresh "
                  "context (llama_state_seq_load_file) and the rest decoded there",
       "shift": "a prefix decoded at positions moved up by an offset, the cache's positions moved back by it "
                "(llama_memory_seq_add, as context shifting does), the rest decoded after",
       "flash": "successive llama_decode calls with flash attention on, held to the one-call prefill with flash "
                "attention on"}


def entry_of(rec: Record, runner, run, T: int) -> dict:
    """The failing schedule as the reproducer runs it: the worker's request entry, with the width
    the census showed (ubatch) or the sizes it ran (chunked)."""
    asked = next(e for e in (runner.result or {}).get("asked", []) if e["name"] == rec.worst_schedule)
    e = {k: v for k, v in asked.items() if k != "widths"}
    if e["name"] == "ubatch":
        w = int(run.steps[0]) if run.steps else int(asked["widths"][0])
        e.update(width=w, sizes=[T])
    return e


def write(rec: Record, entry: dict, tokens: list, threshold: float, gguf_name: str, path: Path, version: str) -> Path:
    finding = rec.reason or rec.verdict
    text = TEMPLATE.format(model_type=rec.model_type, version=version, schedule=entry["name"],
                           how=HOW.get(entry["name"], entry["name"]), finding=str(finding).replace('"""', "'''")[:300],
                           gguf=gguf_name, entry=entry, tokens=tokens, threshold=float(threshold))
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(".py.part")
    part.write_text(text, encoding="utf-8")
    part.replace(path)
    return path


def run_reproducer(path: Path, python: str, timeout: float = 300.0) -> tuple[int, str]:
    """(exit status, last line) of a reproducer in llama.cpp's interpreter, isolated (`-I`)."""
    from ...impls.foreign import runnable
    from .environment import worker_env

    try:
        p = subprocess.run([runnable(python), "-I", str(path)], capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL, env=worker_env())
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout:g} s"
    lines = [ln for ln in (p.stdout.strip() or p.stderr.strip()).splitlines() if ln.strip()]
    return p.returncode, lines[-1] if lines else ""


def keep_gguf(src: Path, dst: Path) -> None:
    """The GGUF a reproducer reads, beside it (written whole: a copy, then a rename)."""
    part = dst.with_suffix(".gguf.part")
    shutil.copyfile(src, part)
    part.replace(dst)


def attach(rec: Record, c, runner, gguf: Path, repro_dir: Path, python: str) -> None:
    """Write the finding's reproducer and its GGUF into `repro_dir`, run it once: `reproducer`,
    `reproducer_status`, `reproducer_output`."""
    run_ = next((r for r in (c.runs + c.unmeasured if c is not None else []) if r.schedule == rec.worst_schedule),
                None)
    if run_ is None:
        return
    name = f"{rec.model_type}-llamacpp"
    Path(repro_dir).mkdir(parents=True, exist_ok=True)
    keep_gguf(gguf, Path(repro_dir) / f"{name}.gguf")
    threshold = c.tolerance * c.noise.per_layer[-1]
    path = write(rec, entry_of(rec, runner, run_, c.tokens.size(1)), c.tokens[0].tolist(), threshold, f"{name}.gguf",
                 Path(repro_dir) / f"{name}.py", str((runner.result or {}).get("llama_cpp_python")))
    rec.reproducer = str(path)
    rec.reproducer_status, rec.reproducer_output = run_reproducer(path, python)
