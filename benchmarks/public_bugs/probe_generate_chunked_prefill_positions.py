"""transformers#43082: generate()'s chunked prefill (prefill_chunk_size) set position_ids from
the chunk's cache_position in a way that did not number every chunk from its place in the
prompt, so RoPE was applied at wrong positions and the outputs were wrong. Exits 1 while
generate() on Llama with prefill_chunk_size=4 returns other logits than without it, 0 once
they agree."""
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
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, initializer_range=0.3,
        pad_token_id=0, eos_token_id=1, bos_token_id=0,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(2, 128, (1, 14))
    kwargs = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, output_logits=True,
                  return_dict_in_generate=True)
    with torch.no_grad():
        plain = model.generate(ids, **kwargs)
        chunked = model.generate(ids, prefill_chunk_size=4, **kwargs)
    ref = torch.stack(plain.logits)
    got = torch.stack(chunked.logits)
    verdict("generate with prefill_chunk_size=4 vs without (llama)", (got - ref).abs().max(), ref)


if __name__ == "__main__":
    run(main)
