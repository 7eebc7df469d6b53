"""transformers#47086 (fixed by #47087): on a continued multi-token forward (chunked prefill,
cache continuation) create_recurrent_attention_mask returned None once the cache held a
recurrent state, so the padding of the new chunk was not zeroed out of the conv /
linear-attention path of hybrids (Qwen3-Next here) and leaked into every later real token. Pads
whose embedding is not zero (any pad id other than an embedding's padding_idx) show it. Exits 1
while the left-padded row, prefilled in two chunks with its padding inside the second, differs
from the row alone, 0 once it agrees, 2 when the same chunks without padding are already off
(another bug in the way)."""
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
        initializer_range=0.2,
    )
    model = transformers.Qwen3NextForCausalLM(config).eval()
    pad = 7  # an ordinary token as pad: its embedding is not zero
    length, real, split = 16, 6, 8  # row b: 10 pads, so the second chunk starts with 2 of them
    row_a = torch.randint(10, 128, (1, length))
    row_b = torch.randint(10, 128, (1, real))

    def chunked(ids, mask):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        first = forward(model, ids[:, :split], attention_mask=mask[:, :split], position_ids=positions[:, :split])
        return forward(model, ids[:, split:], cache_of(first), attention_mask=mask,
                       position_ids=positions[:, split:]).logits

    # control: the same two chunks without padding must agree, or another bug is in the way
    plain = torch.cat([row_a, torch.randint(10, 128, (1, length))], 0)
    control = (chunked(plain, torch.ones_like(plain)) - forward(model, plain).logits[:, split:]).abs().max()
    if control > 1e-4 * (1 + forward(model, plain).logits.abs().max()):
        print(f"transformers {transformers.__version__}: chunked prefill is off without padding too "
              f"({float(control):.3e}): another bug in the way, undecided")
        sys.exit(2)
    ids = torch.cat([row_a, torch.cat([torch.full((1, length - real), pad), row_b], 1)], 0)
    mask = torch.ones_like(ids)
    mask[1, : length - real] = 0
    alone = forward(model, row_b).logits[0]
    got = chunked(ids, mask)[1, -real:]
    verdict("left padding inside the second of two prefill chunks (qwen3_next)", (got - alone).abs().max(), alone)

if __name__ == "__main__":
    run(main)
