"""transformers#48745 (fixed by #48760): RoFormerForCausalLM (and BigBird, RemBert, MegatronBert
causal LMs) with is_decoder=True built a bidirectional attention mask since 5.9.0, so each
position of the full forward saw the tokens after it, while cached decoding (one token at a
time) cannot: the full pass and the cached path disagree. Exits 1 while changing the last
tokens moves RoFormer's logits at earlier positions, 0 once it does not."""
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
    config = transformers.RoFormerConfig(
        vocab_size=128, embedding_size=64, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, is_decoder=True, max_position_embeddings=64,
    )
    model = transformers.RoFormerForCausalLM(config).eval()
    ids = torch.randint(0, 128, (1, 16))
    changed = ids.clone()
    changed[:, 12:] = (changed[:, 12:] + 1) % 128
    with torch.no_grad():
        before = model(ids).logits[:, :12]
        after = model(changed).logits[:, :12]
    verdict("first 12 positions, last 4 tokens changed (roformer)", (after - before).abs().max(), before)


if __name__ == "__main__":
    run(main)
