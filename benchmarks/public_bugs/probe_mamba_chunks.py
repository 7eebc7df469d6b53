"""transformers#31909 (open): MambaMixer fed several tokens at once with cache_params reads the
cached state only on its one-token branch, so feeding a Mamba model in chunks is wrong while one
token at a time is right (FalconMamba's and Jamba's mixers are declared copies). Exits 1 while
Mamba's chunked prefill leaves the full pass's logits or raises in the cached step, 0 once they
agree."""
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
    config = transformers.MambaConfig(
        vocab_size=128, hidden_size=64, state_size=16, num_hidden_layers=2, expand=2, conv_kernel=4,
    )
    model = transformers.MambaForCausalLM(config).eval()
    ids = torch.randint(0, 128, (1, 24))
    full = forward(model, ids).logits
    first = forward(model, ids[:, :12])
    try:
        second = forward(model, ids[:, 12:], cache_of(first))
    except (IndexError, RuntimeError) as exc:
        print(f"transformers {transformers.__version__}: the cached 12-token step raised {type(exc).__name__}: {exc}")
        sys.exit(1)
    chunked = torch.cat([first.logits, second.logits], dim=1)
    verdict("chunked prefill 12+12 (mamba)", (chunked - full).abs().max(), full)


if __name__ == "__main__":
    run(main)
