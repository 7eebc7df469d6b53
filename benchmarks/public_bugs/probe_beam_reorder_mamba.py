"""transformers#46612 (fixed by #46819): beam search reordered the cache only when it was passed
as past_key_values, so a model whose cache travels under another name (Mamba's cache_params)
kept every beam's state in its old order: beams continue from another beam's state. Exits 1
while Mamba's beam search with the cache differs from the same beam search without it, 0 once
they agree, 2 when greedy decoding already differs with the cache (another bug in the way)."""
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
        vocab_size=128, hidden_size=64, state_size=16, num_hidden_layers=2, expand=2,
        conv_kernel=4, initializer_range=0.5, pad_token_id=0, eos_token_id=1, bos_token_id=0,
    )
    model = transformers.MambaForCausalLM(config).eval()
    ids = torch.randint(2, 128, (1, 6))
    kwargs = dict(num_beams=4, num_return_sequences=4, max_new_tokens=8, min_new_tokens=8,
                  do_sample=False, output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        # control: greedy decoding with and without the cache must agree (decode itself is right)
        greedy = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False)
        if not torch.equal(model.generate(ids, use_cache=True, **greedy), model.generate(ids, use_cache=False, **greedy)):
            print(f"transformers {transformers.__version__}: greedy decoding differs with the cache too: "
                  "another bug in the way, undecided")
            sys.exit(2)
        cached = model.generate(ids, use_cache=True, **kwargs)
        uncached = model.generate(ids, use_cache=False, **kwargs)
    same = torch.equal(cached.sequences, uncached.sequences)
    err = (cached.sequences_scores - uncached.sequences_scores).abs().max()
    if not same:
        err = torch.tensor(float("inf"))
    verdict("beam search, cache vs no cache (mamba)", err, uncached.sequences_scores,
            unit="max |dscore| (inf: other sequences)")


if __name__ == "__main__":
    run(main)
