"""The vLLM worker's pieces that drive no engine (`worker.py` imports them as a sibling module).

Like the worker, this runs in vLLM's own environment: it imports the standard library only (numpy
and vLLM's classes are handed in). It holds the conversion of vLLM's log-probs to arrays
(`dense`, `per_position`), the logits processor that forces a decode to the row's own tokens
(`make_force_processor`), a crash's one-line message with vLLM's innermost frame
(`crash_message`), and the watchdog that turns a request stuck inside vLLM into that schedule's
result (`watch`, `Stuck`, `DEADLINE`, `STUCK_S`).
"""

import os
import signal
import threading
import time
import traceback

STUCK_S = 120  # one request of a tiny model takes seconds; past this, the watchdog interrupts it
# [when the request running now counts as stuck, whether the watchdog interrupted it]
DEADLINE = [float("inf"), False]


class Stuck(BaseException):
    """The watchdog's interrupt: a BaseException, so vLLM's `except Exception` handlers let it by."""


def watch() -> None:
    """Start the watchdog (from the main thread): once a request passes DEADLINE[0], signal the main
    thread (SIGUSR1), whose handler raises `Stuck` wherever it is, a wait on another thread's
    work included. A request stuck inside vLLM, a step that never returns or steps that make no
    progress, is then that schedule's result rather than a hang the census can only time out.
    What stays stuck in another thread dies with the worker, which the caller then ends."""
    def interrupt(signum, frame):
        raise Stuck()
    signal.signal(signal.SIGUSR1, interrupt)
    main = threading.main_thread().ident

    def loop():
        while True:
            time.sleep(1.0)
            if time.time() > DEADLINE[0]:
                DEADLINE[:] = [float("inf"), True]
                signal.pthread_kill(main, signal.SIGUSR1)
    threading.Thread(target=loop, name="smearcli-watchdog", daemon=True).start()


def stuck(e: BaseException) -> bool:
    """Whether `e` is the watchdog's interrupt."""
    return isinstance(e, Stuck)


def crash_message(e: BaseException) -> str:
    """`Type: first line (at vllm/...py:LINE in FUNCTION)`, the innermost frame under a vllm directory."""
    here = os.path.dirname(os.path.abspath(__file__))  # the worker's own files sit under a vllm directory too
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if f"{os.sep}vllm{os.sep}" in f.filename and os.path.dirname(os.path.abspath(f.filename)) != here]
    where = ""
    if frames:
        f = frames[-1]
        where = f" (at {f.filename.split('site-packages/')[-1]}:{f.lineno} in {f.name})"
    if stuck(e):
        return f"vLLM's engine did not finish the request in {STUCK_S} s{where}"
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}{where}"


def dense(entries, vocab, np):
    """One position's {token id: Logprob} as a (vocab,) array; all NaN past the vocabulary (garbage)."""
    row = np.full(vocab, np.nan, dtype=np.float32)
    if entries is None:
        return row
    for tok, lp in entries.items():
        if not 0 <= tok < vocab:
            row[:] = np.nan
            return row
        row[tok] = lp.logprob if hasattr(lp, "logprob") else lp
    return row


def per_position(out, vocab, np):
    """(positions, vocab): prompt log-probs moved to the position that computed them, then each
    generated token's (the first generated one comes from the last prompt position)."""
    rows = [dense(e, vocab, np) for e in (out.prompt_logprobs or [None])[1:]]
    rows += [dense(e, vocab, np) for e in (out.outputs[0].logprobs or [])]
    return np.stack(rows)


def make_force_processor(base):
    """A logits processor that makes a request generate `extra_args["force"]` in order (`base`:
    vLLM's LogitsProcessor)."""
    import torch

    class Force(base):
        def __init__(self, vllm_config, device, is_pin_memory):
            self.rows = {}  # batch index -> (forced ids, the request's live output ids)

        def is_argmax_invariant(self):
            return False

        def update_state(self, batch_update):
            if batch_update is None:
                return
            for i in batch_update.removed:
                self.rows.pop(i, None)
            for i, params, _prompt, output in batch_update.added:
                force = (params.extra_args or {}).get("force") if params is not None else None
                if force is not None:
                    self.rows[i] = (force, output)
                else:
                    self.rows.pop(i, None)
            for a, b, kind in batch_update.moved:
                ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
                if ra is not None:
                    self.rows[b] = ra
                if rb is not None and str(kind).endswith("SWAP"):
                    self.rows[a] = rb

        def apply(self, logits):
            for i, (force, output) in self.rows.items():
                k = len(output)
                if k < len(force):
                    keep = logits[i, force[k]].clone()
                    logits[i] = float("-inf")
                    logits[i, force[k]] = keep if torch.isfinite(keep) else 0.0
            return logits

    return Force
