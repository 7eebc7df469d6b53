"""Our nanochat model: its config, the GPT and its KV cache, the two smear logics, the GPT as one
runner per logic (`gpt_runners`), where its weights and token ids come from (`checkpoint`,
`weights`, `discover`, `tokenizer`), generation and its FLOPs. What the census and the other engines
run instead is theirs (`smearcli.engines`)."""
