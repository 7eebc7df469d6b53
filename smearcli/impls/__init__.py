"""Who runs the model. `smearcli.compare`, `smearcli.schedules` and the renderers drive any model
with our GPT's interface, so another implementation plugs in without touching them:

- `model(idx, cache=None, smear=None, capture=None) -> logits (B, T, V)`: one step; with a cache
  the tokens sit at the cache's position and the cache advances; `capture`, a list, receives the
  first capture point and every block's output, (B, T, C) in fp32;
- `new_cache(batch_size, max_len)`: a cache with `get_pos()`, `prev_embedding` and
  `expand_from(other)` (engine-style batch expansion);
- `config` (`smearcli.config.GPTConfig`), `dtype`, `device`, `smear_lambda`;
- `smear_terms(idx)`: (pre-smear embedding, gate, scale) for the analytic check, or None.

Our own model (`smearcli.model.GPT`) runs the old and the fixed logic; `impls.nanochat` wraps a
user's nanochat checkout (its own GPT and KVCache; the logic is whatever their code does).
"""
