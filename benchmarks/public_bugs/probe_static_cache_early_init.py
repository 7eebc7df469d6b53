"""transformers#46439 (fixed by #46446): Cache.early_initialization pre-allocated every layer of a
StaticCache from (num_heads, head_dim), linear-attention layers included, so their conv state
got a wrong shape and was flagged initialized; the first forward then raised a RuntimeError in
update_conv_state. Exits 1 while a Qwen3-Next forward on an early-initialized StaticCache raises
or leaves the full forward's logits, 0 once it agrees."""
import inspect
import sys

import torch
import transformers

# The cache argument changed its name over 5.x (past_key_values, cache_params, cache): read it
# from the forward's signature, and the returned cache from whichever field the output fills.
CACHE_NAMES = ("past_key_values", "cache", "cache_params", "state")


def cache_kw(model):
    params = inspect.signature(model.forward).parameters
    for name in CACHE_NAMES:
        if name in params:
            return name
    return "past_key_values"


def cache_of(out):
    for name in CACHE_NAMES:
        value = getattr(out, name, None)
        if value is not None:
            return value
    raise RuntimeError("the forward returned no cache")


def forward(model, ids, cache=None, **kwargs):
    args = dict(input_ids=ids, use_cache=True, **kwargs)
    if cache is not None:
        args[cache_kw(model)] = cache
    with torch.no_grad():
        return model(**args)


def verdict(name, err, ref, tol=1e-4, unit="max |dlogit|"):
    """Exit 1 when err leaves tol relative to the reference's scale, else 0."""
    bound = tol * (1.0 + float(ref.abs().max()))
    bad = float(err) > bound
    print(f"transformers {transformers.__version__}: {name}: {unit} {float(err):.3e} "
          f"(bound {bound:.1e}) -> {'BUG' if bad else 'ok'}")
    sys.exit(1 if bad else 0)


def run(main):
    """A probe that cannot build or run its own input exits 2 (undecided), never 1."""
    try:
        main()
    except SystemExit:
        raise
    except Exception as exc:  # noqa: BLE001 - anything else is the probe's input not running
        print(f"transformers {transformers.__version__}: probe could not run: {type(exc).__name__}: {exc}")
        sys.exit(2)


def main():
    torch.manual_seed(0)
    config = transformers.Qwen3NextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"], num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
        shared_expert_intermediate_size=64, decoder_sparse_step=1, mlp_only_layers=[],
    )
    model = transformers.Qwen3NextForCausalLM(config).eval()
    ids = torch.randint(0, 128, (1, 10))
    full = forward(model, ids).logits
    cache = transformers.StaticCache(config=config, max_cache_len=32)
    cache.early_initialization(1, config.num_key_value_heads, config.head_dim, torch.float32, torch.device("cpu"))
    try:
        got = forward(model, ids, cache).logits
    except RuntimeError as exc:
        print(f"transformers {transformers.__version__}: forward on the early-initialized StaticCache raised: {exc}")
        sys.exit(1)
    verdict("forward on an early-initialized StaticCache (qwen3_next)", (got - full).abs().max(), full)


if __name__ == "__main__":
    run(main)
