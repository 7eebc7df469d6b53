"""Token files: a row too long for the model is refused before its ids are parsed, a compressed
tensor file by its zip index before anything inflates, and torch's warnings never reach stderr
beside the one line of an error."""

from __future__ import annotations

import warnings
import zipfile

import pytest
import torch

import smearcli.gpt.checkpoint as checkpoint
import smearcli.measure.inputs as inputs
from hardening_util import FAST, PT, edit_state, invoke, write_checkpoint
from smearcli.gpt.config import GPTConfig
from smearcli.util.errors import UserError
from smearcli.measure.inputs import TOKENS_MAX_BYTES, load_tokens
from zip_util import rezip_deflated

ROTARY = GPTConfig(n_layer=1, n_embd=64, n_head=1, n_kv_head=1).rotary_len  # FAST's model: 5,120 positions


def test_a_row_beyond_the_rotary_table_is_refused_before_its_ids_are_parsed(tmp_path, monkeypatch):
    n = 1_100_000
    big = tmp_path / "big.json"
    row = ", ".join(str(100 + i % 156) for i in range(n))
    big.write_text(f"[[{row}], [{row}]]")  # 11 MB, as a user's file
    assert big.stat().st_size > 10_000_000
    small = tmp_path / "small.json"
    small.write_text("[[1, 2, 3], [4, 5, 6]]")
    odd = tmp_path / "odd.json"  # a first row that is not plain ids: parsed, and refused as usual
    odd.write_text("[[1, true, 3]]")
    saved = tmp_path / "long.pt"
    torch.save(torch.zeros(1, ROTARY + 1, dtype=torch.long), saved)

    def parsed(*a, **k):
        raise AssertionError("the file was parsed")
    with monkeypatch.context() as m:
        m.setattr(inputs.json, "loads", parsed)
        with pytest.raises(UserError, match=f"big.json: {n:,} tokens per row exceed what the model's rotary "
                           f"table covers \\({ROTARY:,} positions\\)"):
            load_tokens(big, 256, max_len=ROTARY)
    assert torch.equal(load_tokens(small, 256, max_len=3), torch.tensor([[1, 2, 3], [4, 5, 6]]))
    with pytest.raises(UserError, match="small.json: 3 tokens per row exceed"):
        load_tokens(small, 256, max_len=2)
    with pytest.raises(UserError, match="expected a list of integer ids"):
        load_tokens(odd, 256, max_len=2)
    with pytest.raises(UserError, match=f"{ROTARY + 1:,} tokens per row exceed"):
        load_tokens(saved, 256, max_len=ROTARY)
    r = invoke(["compare", *FAST, "--tokens", big], allowed=(2,))
    assert "--tokens" in r.stderr and "rotary table" in r.stderr


def test_a_compressed_token_file_is_refused_by_its_index_before_its_crc_pass(tmp_path, monkeypatch):
    ids = tmp_path / "ids.pt"
    torch.save(torch.arange(16).view(1, 16), ids)
    with zipfile.ZipFile(ids) as z:
        record = next(n for n in z.namelist() if n.endswith("/data/0"))
    bomb = tmp_path / "bomb.pt"
    rezip_deflated(ids, bomb, {record: 2 * TOKENS_MAX_BYTES})
    assert bomb.stat().st_size < 1 << 20
    with zipfile.ZipFile(bomb) as z:
        declared = sum(i.file_size for i in z.infolist())

    def inflates(*a, **k):
        raise AssertionError("a record was inflated")
    monkeypatch.setattr(checkpoint, "zip_members", inflates)  # check_torch_file's CRC pass
    with pytest.raises(UserError, match=f"its tensors take {declared:,} bytes once read, too large"):
        load_tokens(bomb, 256)


@pytest.mark.parametrize("where", ["tokens", "checkpoint"])
def test_torch_warnings_stay_off_stderr(tmp_path, where):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # creating one warns, too
        q = torch.quantize_per_tensor(torch.arange(16.0).view(1, 16), 1.0, 0, torch.qint8)
    if where == "tokens":
        path = tmp_path / "q.pt"
        torch.save(q, path)
        load = lambda: load_tokens(path, 256)  # noqa: E731
    else:
        d = write_checkpoint(tmp_path / "d1")
        edit_state(d, lambda sd: sd.__setitem__("smear_lambda", q))
        load = lambda: checkpoint.read_state_dict(d / PT)  # noqa: E731
    was = torch.is_warn_always_enabled()
    torch.set_warn_always(True)  # torch warns once a process: here, every time, whatever ran before
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with pytest.raises(UserError, match="a quantized tensor"):
                load()
    finally:
        torch.set_warn_always(was)
    assert [str(w.message)[:60] for w in seen] == []
