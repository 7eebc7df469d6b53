"""llama.cpp as a runner: its own micro-batches, calls, sequence copies and removals, in its own
environment, through a subprocess.

```python
from smearcli.engines import llamacpp
runner = llamacpp.LlamaCppRunner(llamacpp.Settings(python="/opt/llamacpp/bin/python", model="tiny-llama/",
                                                   vocab=256))
result = compare.compare([runner], tokens, ["prefill", "ubatch", "chunked", "decode"], reference=LogProbs(hf))
```

llama.cpp is a compiled library whose converter pins other torch and transformers versions, so
it runs in another interpreter (`Settings.python`, made by `scripts/make_env.sh llamacpp`):
smearcli writes a request (JSON: the model directory or a GGUF file, the token ids, what each
schedule sets), `worker.py` (shipped in this package, importing llama-cpp-python's low-level
bindings and never smearcli) converts the model to a float32 GGUF once, loads it with the KV
cache in float32, runs every schedule in a fresh context and answers with `.npy` logits, never
pickles. `LlamaCppRunner.run` turns them into one `RunResult` per schedule, as log-probabilities
(the reference, the model's full forward in transformers, goes through `runner.LogProbs`).

What each schedule is in llama.cpp: prefill, one `llama_decode` with every position's logits;
ubatch (registered here), the same one call with `n_ubatch` below the row's length, once per
width of `Settings.widths` (the run shown is the width furthest from the one-call prefill; the
notes list every width); chunked, successive calls; decode, a call per token; prefix, a prefix on
one sequence copied to a second (`llama_memory_seq_cp`) that continues; rollback, drafts whose
rejected tokens are removed (`llama_memory_seq_rm`) and decoded right (a partial removal
llama.cpp refuses on recurrent memory is its documented limit: the run checked nothing, and says
so); batched (registered here), the row and its first two thirds as two sequences in one call;
split (registered here), the same in a cache that is not unified (llama.cpp's default); swa
(registered here), chunked's calls with the sliding-window layers keeping only their window
(`swa_full` off, as llama-server runs them); mixed (registered here), rollback's drafts with a
one-token step between them that is removed whole (the last call rejected in full) before the next
draft redoes its position (speculative decoding interleaves one-token and multi-token steps);
restore (registered here), half the row decoded, that sequence's state saved to a file and loaded
into a fresh context (`llama_state_seq_save_file` / `_load_file`, as a server restores a saved
slot), the rest decoded there (a state file torn on disk is this machine's failure: a UserError).
A worker that dies inside llama.cpp is that schedule's crash, with llama.cpp's frame where it
printed one; a fresh worker runs the rest.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import torch

from ...util.errors import UserError
from ...impls import foreign
from ...util.defaults import ROLLBACK
from ...measure.runner import CROP, PREFIX_CACHE, Described
from ...measure.schedules import register
from ...judging import judge
from ...measure.steps import PREFIX_HIT, RunResult, Schedule, ScheduleOptions, chunk_plan, prompt_len
from .calls import ENVIRONMENT, INAPPLICABLE, REFUSED, call_worker
from .environment import PROTOCOL, WORKER

ENV_PYTHON = "SMEARCLI_LLAMACPP_PYTHON"
MICRO_BATCHES = "micro_batches"  # capability: one call split into micro-batches (`n_ubatch`)
SEQUENCES = "sequences"  # capability: several sequences of different lengths in one call
WINDOW_ONLY = "window_only"  # capability: sliding-window layers that keep only their window (swa_full off)
WHOLE_CALLS = "whole_calls"  # capability: removing all a call decoded (llama_memory_seq_rm), not just a draft's tail
STATE_FILES = "state_files"  # capability: a sequence's state saved to a file and loaded into a fresh context
RESTORED = "restored"  # the mark where the restored state is first read (the first token decoded after it)
SHIFTS = "shifts"  # capability: moving a sequence's cached positions (llama_memory_seq_add)
SHIFTED = "shifted"  # the mark where the shifted cache is first read
FLASH = "flash_attention"  # capability: attention computed by a flash-attention kernel, switched per context
# lengths of the one-call prefills whose spread against the whole row's measures llama.cpp's own rounding
# across batch widths: every position is computed once by each, from an empty cache (no cached path)
SPREAD = (1, 2, 3, 5, 8, 13, 21, 34)
SHIFT_BY = 16  # the shift schedule's offset: small, so that nothing keyed to absolute positions (a long-context
# scaling, llama4's attention temperature) tells the positions apart


def _engine_only(runner, tokens, opts, capture, on_step=None):
    raise ValueError(f"{runner.label}: this schedule is run by llama.cpp itself (Runner.run)")


register(Schedule("ubatch", "one call whose prompt the engine splits into micro-batches (llama.cpp's n_ubatch)",
                  _engine_only, frozenset({MICRO_BATCHES})))
register(Schedule("batched", "the row and its first two thirds as two sequences of one batch",
                  _engine_only, frozenset({SEQUENCES})))
register(Schedule("swa", "chunked calls with the sliding-window layers keeping only their window (swa_full off)",
                  _engine_only, frozenset({WINDOW_ONLY})))
register(Schedule("split", "the row and its first two thirds as two sequences of one call, in a cache that is not "
                  "unified (llama.cpp's default)", _engine_only, frozenset({SEQUENCES})))
register(Schedule("mixed", "rollback's drafts with a one-token step between them taken back whole, as speculative "
                  "decoding interleaves one-token and multi-token steps", _engine_only, frozenset({CROP, WHOLE_CALLS})))
register(Schedule("restore", "half the row, its state saved to a file and loaded into a fresh context, then the rest",
                  _engine_only, frozenset({STATE_FILES}), marks=((RESTORED, "state restored"),)))
register(Schedule("shift", "half the row decoded at positions moved up, the cache's positions then moved back "
                  "(llama_memory_seq_add, as context shifting and cache reuse do), the rest decoded after",
                  _engine_only, frozenset({SHIFTS}), marks=((SHIFTED, "cache shifted"),)))
register(Schedule("flash", "chunked calls with flash attention on, held to the one-call prefill with flash attention "
                  "on", _engine_only, frozenset({FLASH})))
LLAMACPP_SCHEDULES = ("prefill", "ubatch", "chunked", "decode", "prefix", "rollback", "batched", "restore", "swa",
                      "mixed", "split", "shift", "flash")


@dataclass(frozen=True)
class Settings:
    python: str  # the interpreter of llama.cpp's environment
    model: Optional[str]  # a Hugging Face model directory, converted to GGUF by the worker
    vocab: int
    gguf: Optional[str] = None  # a GGUF file to load instead (checked by `gguf_header.check` first)
    gguf_arch: Optional[str] = None  # its general.architecture (the header check's), held to the config's
    widths: tuple[int, ...] = (3, 4, 5, 7)  # the ubatch schedule's n_ubatch values
    cache_type: str = "f32"  # the KV cache's type_k/type_v; "f16" is llama.cpp's default
    f16_too: bool = True  # also run prefill and decode on the default float16 cache, as a note
    spread: tuple[int, ...] = SPREAD  # one-call prefills of the row's first tokens: llama.cpp's own rounding
    threads: int = 1
    device: str = "cpu"
    timeout_s: float = 1800.0  # the whole worker run
    stuck_s: float = 300.0  # one schedule; past it the worker's watchdog ends it
    worker: str = str(WORKER)
    env: dict = field(default_factory=dict)
    keep_gguf: Optional[str] = None  # where the converted GGUF is copied before the worker's directory goes


def widths_for(config, T: int) -> tuple[int, ...]:
    """n_ubatch values: around the model's convolution width (where a recurrent model carries its
    conv state across micro-batches) and small odd ones, each below T."""
    conv = next((int(getattr(config, k)) for k in ("conv_kernel", "d_conv", "mamba_d_conv", "conv_L_cache",
                                                    "short_conv_kernel", "conv_kernel_size")
                 if isinstance(getattr(config, k, None), int)), None)
    ws = {3, 5, 7} | ({conv - 1, conv, conv + 1} if conv else set())
    return tuple(sorted(w for w in ws if 1 <= w < T))


def short_len(T: int) -> int:
    """The shorter sequence of the batched schedule: two thirds of the row."""
    if T < 3:
        raise UserError(f"the batched schedule needs at least 3 tokens, got {T}")
    return T - T // 3


def prefix_len(T: int) -> int:
    if T < 2:
        raise UserError(f"the prefix schedule needs at least 2 tokens, got {T}")
    return T // 2


def request(s: Settings, tokens: torch.Tensor, schedules: Sequence[str], opts: ScheduleOptions) -> dict:
    T = tokens.size(1)

    def params(name: str) -> dict:
        if name in ("chunked", "swa", "flash"):
            return {"sizes": chunk_plan(T, opts)}
        if name == "ubatch":
            return {"widths": [w for w in s.widths if 1 <= w < T] or [max(1, T // 2)]}
        if name in ("prefix", "restore", "shift"):
            return {"prefix": prefix_len(T), **({"offset": SHIFT_BY} if name == "shift" else {})}
        if name in ("rollback", "mixed"):
            if not 0 < opts.reject < opts.draft:
                raise ValueError(f"rollback rejects between 1 and draft - 1 tokens of each draft "
                                 f"({opts.draft}), got {opts.reject}")
            return {"prompt": prompt_len(T, opts), "draft": opts.draft, "reject": opts.reject}
        if name in ("batched", "split"):
            return {"short": short_len(T)}
        return {}

    def sized(name: str) -> dict:  # the user's sizes that cannot be run are theirs to change
        try:
            return params(name)
        except ValueError as err:
            raise UserError(str(err)) from None

    entries = foreign.entries("llamacpp", LLAMACPP_SCHEDULES, schedules, sized)
    return {"protocol": PROTOCOL, "model": str(Path(s.model).resolve()) if s.model else None,
            "gguf": str(Path(s.gguf).resolve()) if s.gguf else None,
            "expect_arch": str(Path(s.model).resolve()) if s.gguf and s.model else None, "gguf_arch": s.gguf_arch,
            "rows": tokens.tolist(), "vocab": s.vocab, "cache_type": s.cache_type, "f16_too": s.f16_too,
            "threads": s.threads, "device": s.device, "stuck_s": s.stuck_s, "schedules": entries,
            "spread": [n for n in s.spread if 1 <= n < T]}


class LlamaCppRunner(foreign.WholeSchedules):
    """llama.cpp's runs of the schedules as one series. `run()` calls the worker once, for every
    schedule of the comparison, the first time it is asked; it has no forward pass of its own."""

    label = "llamacpp"
    words = "llama.cpp"
    series = "llama.cpp (its micro-batches, calls, sequence copies and removals)"
    layers = ("logits",)
    capabilities = frozenset({PREFIX_CACHE, CROP, MICRO_BATCHES, SEQUENCES, STATE_FILES, WINDOW_ONLY, WHOLE_CALLS,
                              SHIFTS, FLASH})
    runs_itself = frozenset(LLAMACPP_SCHEDULES)

    def __init__(self, settings: Settings, schedules: Sequence[str] = LLAMACPP_SCHEDULES):
        self.settings, self.schedules = settings, [s for s in schedules if s in LLAMACPP_SCHEDULES]
        if "prefill" not in self.schedules:  # llama.cpp's own one call: what the cached paths are held to
            self.schedules.insert(0, "prefill")
        self.name, self.device, self.dtype = str(settings.gguf or settings.model), torch.device("cpu"), torch.float32
        self.result: Optional[dict] = None
        self.extra: dict = {}  # "prefill_f16", "decode_f16": RunResults on llama.cpp's default cache
        self.spread: Optional[float] = None  # llama.cpp's own rounding across batch widths (`own_spread`)

    def describe(self) -> Described:
        return Described(self.label, self.series, self.name, "llama.cpp", "float32", self.settings.device,
                         notes=tuple(self.notes()))

    def notes(self) -> list[str]:
        r = self.result
        if r is None:
            return []
        out = []
        conv = r.get("convert")
        if conv:
            out.append(f"llama.cpp (llama-cpp-python {r.get('llama_cpp_python')}): converted to a float32 GGUF "
                       f"({conv.get('arch')}, {conv.get('bytes', 0) / 1e6:.1f} MB) in {conv.get('convert_s')} s, "
                       f"loaded in {r.get('load_s')} s, {r.get('total_s')} s in the worker, {r.get('wall_s')} s "
                       f"in all; KV cache {self.settings.cache_type}; compared as log-probabilities")
        elif r.get("gguf"):
            out.append(f"llama.cpp (llama-cpp-python {r.get('llama_cpp_python')}): {r.get('gguf')} loaded in "
                       f"{r.get('load_s')} s; KV cache {self.settings.cache_type}; compared as log-probabilities")
        if r.get("recurrent") or r.get("hybrid"):
            out.append(f"llama.cpp keeps a {'hybrid' if r.get('hybrid') else 'recurrent'} memory for this model")
        for d in r.get("deaths", []):
            out.append(f"a worker died ({d}); a fresh one ran the schedules after it")
        for name in ("ubatch", "flash"):
            run = (self._runs or {}).get(name)
            if run is not None and run.notes:
                out += list(run.notes)
        out += self.f16_notes()
        return out

    def f16_moves(self) -> dict:
        """{schedule: max |d log-prob|} that llama.cpp's default float16 KV cache moves prefill and
        decode by, against the float32 cache the comparison runs (`Settings.f16_too`)."""
        out = {}
        for name in ("prefill", "decode"):
            a, b = (self._runs or {}).get(name), self.extra.get(name + "_f16")
            if a is None or b is None or a.outcome or b.outcome or a.logits.shape != b.logits.shape:
                continue
            out[name] = (a.logits - b.logits).abs().max().item()
        return out

    def f16_notes(self) -> list[str]:
        """How far llama.cpp's default float16 KV cache moves the log-probs, per schedule."""
        return [f"llama.cpp's default float16 KV cache moves {name} by {d:.3g} (max |d log-prob| against the float32 "
                "cache this comparison runs)" for name, d in self.f16_moves().items()]

    def collect(self, tokens, options, workdir: Path) -> dict:
        req = request(self.settings, tokens.cpu(), self.schedules, options)
        self.result = call_worker(self.settings, req, workdir)
        self.result["asked"] = req["schedules"]
        converted = workdir / "model.gguf"
        if self.settings.keep_gguf and converted.is_file():
            shutil.copyfile(converted, self.settings.keep_gguf)
        if self.result.get("arch_mismatch"):
            want, got = self.result["arch_mismatch"]
            raise UserError(f"{self.settings.gguf}: its architecture is {got!r}, and the config of "
                            f"{self.settings.model} is {want!r} in llama.cpp: not the same model")
        runs = {e["name"]: to_run(e, self.result, workdir, tokens.cpu(), self.settings.vocab) for e in req["schedules"]}
        if "ubatch" in runs:
            runs["ubatch"] = pick_width(runs)
        if "flash" in runs:
            runs["flash"] = on_prefill(runs)
        self.spread = own_spread(self.result, runs.get("prefill"), workdir, self.settings.vocab)
        for name in ("prefill", "decode"):
            if any(e["name"] == name + "_f16" for e in self.result["schedules"]):
                self.extra[name + "_f16"] = to_run({"name": name + "_f16"}, self.result, workdir,
                                                   tokens.cpu(), self.settings.vocab)
        return runs


def own_spread(res: dict, prefill, workdir: Path, V: int) -> Optional[float]:
    """llama.cpp's own rounding across batch widths: the largest |d log-prob| between the whole row's
    one-call prefill and one-call prefills of its first tokens (`Settings.spread`), each from an
    empty cache, at the positions both computed. No cached path is in it, so it can stand beside the
    float64 floor (`own_prefill.against_prefill`); None where it was not measured."""
    entry = next((e for e in res.get("schedules") or [] if e["name"] == "spread"), None)
    if entry is None or entry.get("outcome") or prefill is None or prefill.outcome is not None:
        return None
    R, worst = prefill.logits.size(0), 0.0
    try:
        for n, f in entry["arrays"].items():
            lp = _load(workdir, f, (R, int(n), V))
            worst = max(worst, (lp - prefill.logits[:, :int(n)]).abs().max().item())
    except (KeyError, ValueError, OSError):
        return None
    return worst


def _load(workdir: Path, name: str, shape: tuple) -> torch.Tensor:
    return foreign.load_array(workdir, name, shape, why="llama.cpp's vocabulary against the config's").log_softmax(dim=-1)


def to_run(sched: dict, res: dict, workdir: Path, tokens: torch.Tensor, V: int):
    """One schedule's answer as a RunResult (log-probs as its logits); for ubatch, a dict
    width -> RunResult (`pick_width` chooses the one shown)."""
    R, T = tokens.shape
    name = sched["name"]
    rows = list(range(R))

    def unmeasured(outcome, message, steps=()):
        return RunResult(name, "llamacpp", torch.empty(R, 0, V), None, list(steps), rows, outcome=outcome,
                         message=message)
    entry = next((e for e in res["schedules"] if e["name"] == name), None)
    if entry is None and res.get("not_built"):  # said once, on the first schedule; the others name it
        first = name == next((e["name"] for e in res.get("asked", [])), name)
        return unmeasured(judge.RAISED, f"llama.cpp did not build the model ({res['not_built']})" if first
                          else "not run: llama.cpp did not build the model")
    if entry is None:
        return unmeasured(judge.RAISED, "the llama.cpp worker gave no answer for it (it died before)")
    if entry.get("outcome") == ENVIRONMENT:  # this machine failed the run (a torn state file): no result at all
        raise UserError(f"llama.cpp's worker, {name}: {entry.get('message')}")
    if entry.get("outcome") == REFUSED:
        return unmeasured(judge.CHECKED_NOTHING, entry["message"], entry.get("steps") or ())
    if entry.get("outcome") == INAPPLICABLE:
        return unmeasured(judge.CANNOT_RUN, entry["message"])
    if entry.get("outcome"):
        return unmeasured(judge.RAISED, entry.get("message", ""), entry.get("steps") or ())
    try:
        if name == "ubatch":
            out = {}
            for w, f in entry["arrays"].items():
                w = int(w)
                lp = _load(workdir, f, (R, T, V))
                out[w] = RunResult(name, "llamacpp", lp, None, [w] * (T // w) + ([T % w] if T % w else []), rows)
            return out
        if name in ("batched", "split"):
            S = int(sched["short"])
            lp = _load(workdir, entry["arrays"]["logits"], (2 * R, T, V))
            return RunResult(name, "llamacpp", lp, None, [T], [r for r in rows for _ in (0, 1)], starts=[],
                             notes=(f"{name}: each row and its first {S} tokens as two sequences of one "
                                    f"llama_decode call (rows long/short; the short row's positions from {S} on "
                                    "are the long one's)" + (", in a cache that is not unified" if name == "split"
                                                             else ""),))
        lp = _load(workdir, entry["arrays"]["logits"], (R, T, V))
    except (KeyError, ValueError, OSError) as e:
        return unmeasured(judge.RAISED, f"the llama.cpp worker's answer is unreadable: {e}")
    steps = list(entry.get("steps") or [T])
    if not torch.isfinite(lp).all():
        bad = (~torch.isfinite(lp)).any(dim=-1).any(dim=0).nonzero().flatten().tolist()
        return unmeasured(judge.RAISED,
                          f"llama.cpp returned non-finite logits at {len(bad)} positions (first: {bad[0]})",
                          steps)
    if name == "prefix":
        return RunResult(name, "llamacpp", lp, None, steps, rows, {PREFIX_HIT: [steps[0]]})
    if name == "shift":
        return RunResult(name, "llamacpp", lp, None, steps, rows, {SHIFTED: [steps[0]]},
                         notes=(f"shift: the first {steps[0]} tokens decoded at positions {sched['offset']} on, the "
                                f"cache's positions moved back by {sched['offset']} (llama_memory_seq_add), the rest "
                                "decoded after",))
    if name == "flash":  # its own one-call prefill beside it (`on_prefill` places it)
        try:
            ref = _load(workdir, entry["arrays"]["reference"], (R, T, V))
        except (KeyError, ValueError, OSError) as e:
            return unmeasured(judge.RAISED, f"the llama.cpp worker's answer is unreadable: {e}")
        return {"run": RunResult(name, "llamacpp", lp, None, steps, rows), "reference": ref}
    if name == "restore":
        return RunResult(name, "llamacpp", lp, None, steps, rows, {RESTORED: [steps[0]]},
                         notes=(f"restore: the first {steps[0]} tokens' state saved with llama_state_seq_save_file and "
                                "loaded into a fresh context with llama_state_seq_load_file, the rest decoded there",))
    if name in ("rollback", "mixed"):
        cuts = list(entry.get("cuts") or [])
        note = (f"{name}: drafts of {sched['draft']}" + (", a one-token step removed whole between them" if name == "mixed"
                                                        else "")
                + f", the last {sched['reject']} of each rejected and removed with llama_memory_seq_rm (n_rs_seq "
                f"{entry.get('n_rs_seq', 0)})")
        return RunResult(name, "llamacpp", lp, None, steps, rows, {ROLLBACK: cuts},
                         starts=[p for p in [sched["prompt"]] + cuts if 0 < p < T], notes=(note,))
    return RunResult(name, "llamacpp", lp, None, steps, rows)


def on_prefill(runs: dict):
    """The flash run as the comparison holds it. On the CPU flash attention rounds through float16
    (its one-call prefill departs from the float32 one by design: up to 1.8e-03 in the census of
    2026-12-06, median 2.6e-04), so its cached
    path is held to its own one-call prefill: the run shown is llama.cpp's float32 one-call prefill
    plus the flash run's departure from the flash one-call prefill, position by position. A flash
    cache that matches its own prefill is then exactly the float32 prefill; a departure shows where
    it is born, at its size. The notes say how far flash attention moves the one-call prefill."""
    got, pre = runs.get("flash"), runs.get("prefill")
    if not isinstance(got, dict):
        return got
    run, ref = got["run"], got["reference"]
    if pre is None or pre.outcome is not None:
        return RunResult("flash", "llamacpp", torch.empty(run.logits.size(0), 0, run.logits.size(-1)), None,
                         run.steps, run.row_map, outcome=judge.CANNOT_RUN,
                         message="not run: llama.cpp's float32 one-call prefill, which it is shown against, was not "
                                 "measured")
    moved = (ref - pre.logits).abs().max().item()
    run.logits = pre.logits + (run.logits - ref)
    run.notes = (f"flash: chunked calls with flash attention on, held to llama.cpp's one-call prefill with flash "
                 f"attention on (which flash attention's float16 rounding moves by {moved:.3g} from the float32 "
                 "one-call prefill); shown as the float32 prefill plus its departure from that prefill",)
    return run


def pick_width(runs: dict):
    """The ubatch run shown: the width whose logits are furthest from llama.cpp's one-call prefill
    (the first width where no prefill ran); its notes list every width's distance."""
    by_width = runs.get("ubatch")
    if not isinstance(by_width, dict):
        return by_width
    pre = runs.get("prefill")
    base = pre.logits if pre is not None and pre.outcome is None else None
    dist = {w: (r.logits - base).abs().max().item() if base is not None else 0.0 for w, r in by_width.items()}
    w = max(dist, key=lambda k: (dist[k], -k))
    words = ", ".join(f"{k}: {dist[k]:.3g}" for k in sorted(dist))
    chosen = by_width[w]
    chosen.notes = (f"ubatch: n_ubatch {', '.join(map(str, sorted(dist)))} each in one call; max |d log-prob| "
                    f"against llama.cpp's one-call prefill by width: {words}; shown: {w}",)
    return chosen
