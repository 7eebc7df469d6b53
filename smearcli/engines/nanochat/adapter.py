"""The user's nanochat model behind the interface `smearcli.measure.schedules` drives (see
`smearcli.impls`): built the way upstream builds it (on the meta device, `to_empty`,
`init_weights`, `load_state_dict(strict=True, assign=True)`), from our model's weights or from a
checkpoint, with its own forward pass and KVCache.

What is captured: upstream's post-smear embedding is not the output of any module, so the first
capture point here is the input of block 0 (`block0_in`), which equals
(resid_lambdas[0] + x0_lambdas[0]) x the post-smear embedding; then every block's output and the
logits, as for our own model.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

from ...gpt.config import ConfigError, GPTConfig
from ...util.errors import UserCodeError, UserError
from ...gpt.model import param_shapes, rms_norm
from ...util.defaults import layer_names
from ...util.preflight import check_model_memory
from ...measure.runner import BOS_DOCUMENTS, DOCUMENT_MASK, EXPAND, SMEAR_TERMS, Described, ModelRunner, Output
from ...gpt.smear import smear_gate
from ...gpt.checkpoint import (
    NoSmearParameters, check_tensors, find_step, read_meta, read_state_dict, smear_keys_missing,
)
from .guard import return_line, returned_at, user_code
from .sandbox import FIRST_CAPTURE, NanochatCode, computing_in

USER_LOGIC = "yours"  # the label of the user's runs: their code has its own smear logic


class NanochatCache:
    """smearcli's cache interface over the user's KVCache."""

    def __init__(self, inner, code: Optional[NanochatCode] = None):
        self.inner = inner
        self.code = code

    def _theirs(self, what: str):
        return user_code(self.code.root, what, self.code.timeout) if self.code else contextlib.nullcontext()

    def get_pos(self) -> int:
        with self._theirs("KVCache.get_pos"):
            pos = self.inner.get_pos()
        if isinstance(pos, bool) or not isinstance(pos, (int, Tensor)):
            raise UserCodeError(f"your nanochat code: KVCache.get_pos returned a {type(pos).__name__}, not a position")
        return int(pos)

    @property
    def prev_embedding(self):
        return self.inner.prev_embedding

    def expand_from(self, other: "NanochatCache") -> None:
        with self._theirs("KVCache.prefill"):
            self.inner.prefill(other.inner)  # the user's own engine-style expansion


def _first_tensor(x):
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (tuple, list)) and x and isinstance(x[0], Tensor):
        return x[0]
    raise UserCodeError(f"your nanochat code: a block of its GPT returned {type(x).__name__}, not a tensor")


class NanochatModel:
    """The user's GPT behind the interface `smearcli.measure.schedules` drives: `model(idx, cache=,
    smear=, capture=)`, `new_cache`, `config`, `dtype`, `device`.

    `smear` is ignored: the user's code has its own logic. `capture` receives fp32 copies of
    block 0's input and of every block's output, from forward hooks (nothing is patched)."""

    def __init__(self, code: NanochatCode, net: torch.nn.Module):
        self.code = code
        self.net = net
        self.dtype = code.compute_dtype
        blocks = getattr(getattr(net, "transformer", None), "h", None)
        if not isinstance(blocks, torch.nn.ModuleList) or len(blocks) == 0:
            raise UserError(f"nanochat checkout {code.root}: its GPT has no transformer.h (the list of blocks)")
        self.blocks = list(blocks)
        self.config = _our_config(net.config, code.root)
        if len(self.blocks) != self.config.n_layer:
            raise UserError(f"nanochat checkout {code.root}: transformer.h has {len(self.blocks)} blocks, "
                            f"config.n_layer is {self.config.n_layer}")

    @property
    def device(self) -> torch.device:
        return next(self.net.parameters()).device

    @property
    def smear_lambda(self) -> Tensor:
        lam = getattr(self.net, "smear_lambda", None)
        return lam if isinstance(lam, Tensor) else torch.full((1,), float("nan"))

    @torch.inference_mode()
    def smear_terms(self, idx: Tensor):
        """For the analytic check (`smearcli.measure.metrics`): a code with the old smear misses
        (r0 + l0) * gate_t * x_{t-1} at block 0's input (r0, l0: resid_lambdas[0], x0_lambdas[0]).
        None when the model lacks upstream's parameter names."""
        net = self.net
        names = ("transformer", "smear_gate", "smear_lambda", "resid_lambdas", "x0_lambdas")
        if not all(hasattr(net, n) for n in names):
            return None
        with user_code(self.code.root, "the token embedding (transformer.wte)", self.code.timeout):
            x = rms_norm(net.transformer.wte(idx).to(self.dtype))  # the pre-smear embedding (B, T, C)
        gate = smear_gate(x, net.smear_gate.weight, net.smear_lambda)
        return x, gate, (net.resid_lambdas[0] + net.x0_lambdas[0]).float()

    def new_cache(self, batch_size: int, max_len: int) -> NanochatCache:
        c = self.config
        with user_code(self.code.root, "KVCache()", self.code.timeout):
            inner = self.code.KVCache(batch_size=batch_size, num_heads=c.n_kv_head, seq_len=max_len,
                                      head_dim=c.head_dim, num_layers=c.n_layer, device=self.device,
                                      dtype=self.dtype)
            smear_state = hasattr(inner, "prev_embedding")  # a property of theirs may run code
        if not smear_state:
            raise UserError(f"nanochat checkout {self.code.root}: its KVCache has no prev_embedding "
                            f"(where upstream keeps the smear state)")
        return NanochatCache(inner, self.code)

    def __call__(self, idx: Tensor, cache: Optional[NanochatCache] = None, smear=None,
                 capture: Optional[list] = None) -> Tensor:
        hooks = []
        if capture is not None:
            def grab_input(module, args, kwargs):
                capture.append(_first_tensor(args if args else list(kwargs.values())).float().clone())

            def grab_output(module, args, out):
                capture.append(_first_tensor(out).float().clone())

            hooks.append(self.blocks[0].register_forward_pre_hook(grab_input, with_kwargs=True))
            hooks += [b.register_forward_hook(grab_output) for b in self.blocks]
        try:
            # stdout kept for our output; where their forward returns, for a wrong return value
            with (user_code(self.code.root, "GPT.forward", self.code.timeout),
                  computing_in(self.code, self.dtype) if self.dtype != self.code.compute_dtype
                  else contextlib.nullcontext(),  # the float64 copy (`NanochatRunner.float64`)
                  return_line(type(self.net).forward) as returned):
                out = self.net(idx, kv_cache=None if cache is None else cache.inner)
        finally:
            for h in hooks:
                h.remove()
        where = returned_at(returned, self.code.root)
        at = f" at {where}" if where else ""
        if not isinstance(out, Tensor) or out.dim() != 3 or tuple(out.shape[:2]) != tuple(idx.shape):
            got = f"a tensor of shape {tuple(out.shape)}" if isinstance(out, Tensor) else f"a {type(out).__name__}"
            raise UserCodeError(f"your nanochat code: GPT.forward returned {got}{at}, not logits "
                                f"of shape (batch, tokens, vocab) = {tuple(idx.shape)} + (vocab,)")
        if out.shape[2] != self.config.vocab_size:  # every call must give the same width
            step = "without a cache" if cache is None else "with a KVCache"
            raise UserCodeError(f"your nanochat code: GPT.forward {step} returned logits {out.shape[2]} wide{at}, "
                                f"but its config's vocab_size is {self.config.vocab_size}")
        return out


class NanochatRunner(ModelRunner):
    """The user's nanochat code as a `smearcli.measure.runner.Runner` (label "yours"): their GPT, forward
    pass and KVCache, their KVCache.prefill for the engine's cache copy. Their one-token step is
    their own code, so decode is never shared with another runner. A packed row's document mask is
    laid over their own attention calls (`docmask`): their GPT takes none."""

    label = USER_LOGIC
    series = "your code (nanochat checkout)"
    capabilities = frozenset({EXPAND, SMEAR_TERMS, DOCUMENT_MASK, BOS_DOCUMENTS})
    # what a packed table says of this runner when its document mask ran
    document_note = ("the document mask was laid over your code's own attention calls "
                     "(torch.nn.functional.scaled_dot_product_attention); nothing else of it changed; its "
                     "emb@BOS is block 0's input, (resid_lambdas[0] + x0_lambdas[0]) x the post-smear embedding")

    def __init__(self, model: NanochatModel, name: str = "model"):
        self.model, self.name = model, name
        self.layers = tuple([FIRST_CAPTURE] + layer_names(model.config.n_layer)[1:])

    def describe(self) -> Described:
        cfg, code = self.model.config, self.model.code
        lam = self.model.smear_lambda.detach()
        return Described(self.label, self.series, self.name, cfg.shape,
                         str(self.dtype).removeprefix("torch."), str(self.device), cfg.to_dict(),
                         float(f"{float(lam.abs().max()):.6g}"),
                         (f"your code ran with attention {code.attention}, compute dtype "
                          f"{str(code.compute_dtype).removeprefix('torch.')} ({code.dtype_source})",))

    def forward(self, tokens, capture):
        cap = [] if capture else None
        return Output(self.model(tokens, capture=cap), cap)

    def forward_documents(self, tokens, lengths, capture):
        """Their uncached forward with torch's SDPA masked to the documents (`docmask`); a
        `NoDocumentMask` when their attention did not go through it once per block."""
        from .docmask import document_attention

        lengths = list(lengths)
        if sum(lengths) != tokens.size(1):
            raise ValueError(f"documents {lengths} must cover the {tokens.size(1)} tokens of the row")
        cap = [] if capture else None
        with document_attention(lengths, self.model.code.modules.values(), tokens.device) as patch:
            logits = self.model(tokens, capture=cap)
        patch.check(self.model.config.n_layer)
        return Output(logits, cap)

    def new_cache(self, batch, max_len):
        return self.model.new_cache(batch, max_len)

    def step(self, tokens, cache, capture):
        cap = [] if capture else None
        pos = cache.get_pos()  # their KVCache keeps the position: it must advance by the step
        logits = self.model(tokens, cache=cache, capture=cap)
        if cache.get_pos() != pos + tokens.size(1):
            raise UserCodeError(f"your nanochat code: KVCache.get_pos went from {pos} to {cache.get_pos()} "
                                f"over a step of {tokens.size(1)} tokens")
        return Output(logits, cap)

    def expand(self, cache, rows, max_len):
        out = self.model.new_cache(rows, max_len)
        out.expand_from(cache)  # their own KVCache.prefill
        return out

    def smear_terms(self, tokens):
        return self.model.smear_terms(tokens)

    def float64(self):
        """Their code on a float64 copy of their GPT, its cache made in float64 and its calls made
        with their COMPUTE_DTYPE set to float64 (`sandbox.computing_in`); their float32 requests
        are lifted by `precision.lifted()` where a departure is confirmed."""
        from ...measure.precision import float64_model

        net = float64_model(self.model.net)
        twin = NanochatModel.__new__(NanochatModel)
        twin.__dict__.update(self.model.__dict__, net=net, dtype=torch.float64)
        blocks = net.transformer.h
        twin.blocks = list(blocks)
        return NanochatRunner(twin, self.name)


def _our_config(cfg, root: Path) -> GPTConfig:
    """Our GPTConfig (shapes, rotary length) from the user's config object."""
    d = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(vars(cfg))
    known = {f.name for f in dataclasses.fields(GPTConfig)}
    try:
        return GPTConfig.from_dict({k: v for k, v in d.items() if k in known})
    except ConfigError as e:
        raise UserError(f"nanochat checkout {root}: its model config: {e}") from e


def build_nanochat_model(code: NanochatCode, model_config: dict, state_dict: dict,
                         device) -> NanochatModel:
    """Build the user's GPT the way upstream does and load `state_dict` with strict=True."""
    device = torch.device(device)
    try:
        config = code.GPTConfig(**model_config)
    except TypeError as e:
        raise UserError(f"nanochat checkout {code.root}: GPTConfig does not take this model_config: {e}") from e
    devices = [device] if device.type == "cuda" else []
    # init_weights draws from the global RNG: leave the rest of the run's RNG untouched
    with user_code(code.root, "building its GPT", code.timeout), torch.random.fork_rng(devices=devices):
        with torch.device("meta"):
            net = code.GPT(config)
        net.to_empty(device=device)
        net.init_weights()
    try:
        with user_code(code.root, "GPT.load_state_dict", code.timeout):
            net.load_state_dict(state_dict, strict=True, assign=True)
    except UserCodeError as e:  # the weights do not fit their model: the input, not their code
        raise UserError(str(e)) from e
    # parameters keep requires_grad=True, as upstream's checkpoint_manager leaves them: torch picks
    # its matmul kernel for a sliced input from it (see smear.smear_gate), so their smear gate on
    # a few-token step (speculative's drafts of 4) rounded 1e-6 away from how their engine runs it
    # when we turned it off. Every call runs under inference_mode, so no gradient state is kept.
    net.eval()
    return NanochatModel(code, net)


def nanochat_from_model(code: NanochatCode, model) -> NanochatModel:
    """The user's GPT with exactly the weights of our `model` (same config, strict=True)."""
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return build_nanochat_model(code, model.config.to_dict(), sd, model.device)


def nanochat_from_checkpoint(code: NanochatCode, ckpt_dir, step: Optional[int] = None,
                             device="cpu"):
    """Load a nanochat checkpoint into the user's GPT as upstream's checkpoint_manager does (but
    with torch.load(weights_only=True)); returns (model, step, meta)."""
    ckpt_dir, step = find_step(ckpt_dir, step)
    meta_path, model_path = ckpt_dir / f"meta_{step:06d}.json", ckpt_dir / f"model_{step:06d}.pt"
    meta = read_meta(meta_path)
    config = dict(meta["model_config"])
    config.setdefault("window_pattern", "L")  # checkpoints older than sliding windows
    # the meta as our config (fields a fork adds are left to its code): memory and shapes are
    # checked before the user's model is built from it
    known = {f.name for f in dataclasses.fields(GPTConfig)}
    try:
        ours = GPTConfig.from_dict({k: v for k, v in config.items() if k in known})
    except (ConfigError, TypeError) as e:
        raise UserError(f"{meta_path.name}: {e}") from e
    check_model_memory(ours, device, file=model_path)
    sd = read_state_dict(model_path)
    if "transformer.wte.weight" in sd and smear_keys_missing(sd):  # from before the smear existed
        raise NoSmearParameters(f"{model_path.name}: no smear parameters: issue #756 cannot affect this model")
    sd.setdefault("resid_lambdas", torch.ones(ours.n_layer))
    sd.setdefault("x0_lambdas", torch.zeros(ours.n_layer))
    check_tensors(model_path.name, sd, param_shapes(ours))  # shapes, float, no NaN/Inf, as our loader
    dev = torch.device(device)
    if dev.type in ("cpu", "mps"):
        sd = {k: v.float() if v.dtype == torch.bfloat16 else v for k, v in sd.items()}
    sd = {k: v.to(dev) for k, v in sd.items()}
    return build_nanochat_model(code, config, sd, dev), step, meta
