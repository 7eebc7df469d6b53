"""transformers#46032 (fixed by #46084): Mamba2Mixer with a cached state and a multi-token input
took the one-token path (dt[:, 0] kept the first token, the conv and SSM states ignored the
rest), so a chunked prefill or a draft verification differs from the full forward. Exits 1
while the chunked logits leave the full pass's, 0 once they agree."""
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
    config = transformers.Mamba2Config(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16,
        expand=2, state_size=16, n_groups=1, conv_kernel=4, chunk_size=8,
    )
    model = transformers.Mamba2ForCausalLM(config).eval()
    ids = torch.randint(0, 128, (1, 24))
    full = forward(model, ids).logits
    first = forward(model, ids[:, :12])
    second = forward(model, ids[:, 12:], cache_of(first))
    chunked = torch.cat([first.logits, second.logits], dim=1)
    verdict("chunked prefill 12+12 (mamba2)", (chunked - full).abs().max(), full)


if __name__ == "__main__":
    run(main)
