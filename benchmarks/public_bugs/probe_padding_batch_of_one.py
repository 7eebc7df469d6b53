"""transformers#46773 (open): apply_mask_to_padding_states zeroed padding out of the conv and
recurrent path only when the batch held more than one row, so a left-padded batch of one row
ran its padding through the conv and the recurrence into its real tokens (Qwen3.5 and the other
linear-attention hybrids; LFM2 here). Exits 1 while a one-row left-padded prefill differs from
the row alone, 0 once it agrees, 2 when the same row is off in a batch of two as well (another
bug in the way)."""
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
    config = transformers.Lfm2Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        layer_types=["conv", "full_attention"], full_attn_idxs=[1], num_attention_heads=4,
        num_key_value_heads=2, conv_L_cache=3, initializer_range=0.2,
    )
    model = transformers.Lfm2ForCausalLM(config).eval()
    pad, real, pads = 7, 8, 4  # an ordinary token as pad: its embedding is not zero
    row = torch.randint(10, 128, (1, real))
    ids = torch.cat([torch.full((1, pads), pad), row], 1)
    mask = torch.ones_like(ids)
    mask[0, :pads] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    alone = forward(model, row).logits[0]
    # control: the same padded row beside an unpadded one (a batch of two) must agree
    other = torch.randint(10, 128, (1, pads + real))
    two = forward(model, torch.cat([other, ids]), attention_mask=torch.cat([torch.ones_like(mask), mask]),
                  position_ids=torch.cat([torch.arange(pads + real)[None], positions])).logits[1, pads:]
    if (two - alone).abs().max() > 1e-4 * (1 + alone.abs().max()):
        print(f"transformers {transformers.__version__}: the padded row is off in a batch of two too: "
              "another bug in the way, undecided")
        sys.exit(2)
    got = forward(model, ids, attention_mask=mask, position_ids=positions).logits[0, pads:]
    verdict("one left-padded row vs the row alone (lfm2)", (got - alone).abs().max(), alone)


if __name__ == "__main__":
    run(main)
