"""transformers#48280: since #47447 let assisted decoding keep real sliding-window layers
(DynamicSlidingWindowLayer) with past recording on, update() returned the unbounded keys and
values while get_mask_sizes() still sized the mask to the window, so from the second token of
a draft burst past the window attention got more columns than its mask (eager: a RuntimeError
on the size of tensor; SDPA: silently wrong). Exits 1 while assisted generation on Mistral with
a window of 8 raises or returns other tokens than greedy decoding, 0 once they agree."""
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


def mistral(seed):
    torch.manual_seed(seed)
    config = transformers.MistralConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
        initializer_range=0.3, pad_token_id=0, eos_token_id=1, bos_token_id=0,
    )
    config._attn_implementation = "eager"
    return transformers.MistralForCausalLM(config).eval()


def main():
    model, assistant = mistral(0), mistral(1)  # an assistant that disagrees: drafts get rejected
    ids = torch.randint(2, 128, (1, 12))  # longer than the window
    kwargs = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False)
    with torch.no_grad():
        greedy = model.generate(ids, **kwargs)
        try:
            assisted = model.generate(ids, assistant_model=assistant, num_assistant_tokens=5,
                                      num_assistant_tokens_schedule="constant", **kwargs)
        except RuntimeError as exc:
            print(f"transformers {transformers.__version__}: assisted generation raised: {exc}")
            sys.exit(1)
    differ = (greedy != assisted).sum()
    verdict("assisted vs greedy (mistral, window 8)", differ, torch.zeros(1), unit="tokens that differ")


if __name__ == "__main__":
    run(main)
