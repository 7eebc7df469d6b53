"""smearcli.gpt.tokenizer: nanochat's tokenizer.pkl read without running code from it; text and chat ids."""

from __future__ import annotations

import builtins
import os
import pickle
import sys

import pytest

tiktoken = pytest.importorskip("tiktoken")

from smearcli.gpt import tokenizer as tok  # noqa: E402
from smearcli.util.errors import UserError  # noqa: E402
from hardening_util import Payload  # noqa: E402
from tokenizer_util import (CORPUS, build_encoding, encoding_pickle, good_state,  # noqa: E402
                                  write_state, write_tokenizer)

TEXTS = ["the quick brown fox", "Hello, world! 2024", "naïve café ☕ 日本語", "", "  spaces\n\nand\ttabs  ",
         "<|user_start|> is just text here"]


@pytest.fixture
def pkl(tmp_path):
    return write_tokenizer(tmp_path / "tokenizer.pkl")


@pytest.fixture(scope="module")
def enc():
    return build_encoding()


# -- the format, checked against the installed tiktoken -------------------------------------------
def test_encoding_pickles_with_exactly_one_global(pkl):
    """What the restricted unpickler allows is exactly what tiktoken writes, and nothing more."""
    seen = []

    class Recorder(pickle.Unpickler):
        def find_class(self, module, name):
            seen.append((module, name))
            return super().find_class(module, name)

    with open(pkl, "rb") as f:
        Recorder(f).load()
    assert seen == [tok.ENCODING_GLOBAL]


def test_round_trip_matches_the_original_encoding(pkl, enc):
    loaded = tok.load_tokenizer(pkl)
    assert isinstance(loaded, tiktoken.Encoding)
    assert loaded.name == enc.name and loaded.n_vocab == enc.n_vocab
    assert loaded._special_tokens == enc._special_tokens  # noqa: SLF001 - compare the tables themselves
    assert loaded._mergeable_ranks == enc._mergeable_ranks  # noqa: SLF001
    for text in TEXTS + [CORPUS]:
        ids = loaded.encode_ordinary(text)
        assert ids == enc.encode_ordinary(text)
        assert loaded.decode(ids) == text
    # the merges are real: the corpus takes far fewer tokens than bytes
    assert len(loaded.encode_ordinary(CORPUS)) < len(CORPUS.encode()) / 3


def test_reading_runs_no_tiktoken_code(pkl, monkeypatch):
    """The state reaches tiktoken only after it is checked: Encoding's own unpickling hook never runs."""
    def trap(self, state):
        raise AssertionError("tiktoken.Encoding.__setstate__ ran during unpickling")

    monkeypatch.setattr(tiktoken.Encoding, "__setstate__", trap)
    state = tok.read_encoding_state(pkl)
    assert state["name"] == "rustbpe" and state["special_tokens"]["<|bos|>"] == len(state["mergeable_ranks"])
    assert tok.load_tokenizer(pkl).n_vocab == build_encoding().n_vocab


# -- refusals -------------------------------------------------------------------------------------
class SystemPayload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class EvalPayload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return builtins.eval, (f"open({self.marker!r}, 'w')",)


def _malicious(kind, marker):
    if kind == "os.system":
        return pickle.dumps(SystemPayload(marker))
    if kind == "builtins.eval":
        return pickle.dumps(EvalPayload(marker))
    if kind == "builtins.open":
        return pickle.dumps(Payload(marker))
    if kind == "inside the state":  # a genuine-looking Encoding whose ranks hide the payload
        return encoding_pickle({**good_state(), "mergeable_ranks": Payload(marker)})
    if kind == "inside a rank":
        ranks = dict(good_state()["mergeable_ranks"])
        ranks[b"xyz"] = EvalPayload(marker)
        return encoding_pickle({**good_state(), "mergeable_ranks": ranks})
    raise AssertionError(kind)


@pytest.mark.parametrize("kind,glob", [("os.system", "system"), ("builtins.eval", "builtins.eval"),
                                       ("builtins.open", "open"), ("inside the state", "open"),
                                       ("inside a rank", "builtins.eval")])
def test_malicious_pickle_is_refused_without_running(tmp_path, kind, glob):
    live = tmp_path / "ran-plainly"
    try:  # the payload is live: a plain pickle.load runs it (and then may fail on what it returned)
        pickle.loads(_malicious(kind, live))
    except Exception:  # noqa: BLE001
        pass
    assert live.exists()
    marker = tmp_path / "pwned"
    path = tmp_path / "tokenizer.pkl"
    path.write_bytes(_malicious(kind, marker))
    with pytest.raises(UserError) as e:
        tok.load_tokenizer(path)
    assert not marker.exists()  # ...but not when smearcli reads it
    assert "refused" in str(e.value) and glob in str(e.value), str(e.value)


@pytest.mark.parametrize("module,name", [("tiktoken.registry", "get_encoding"), ("tiktoken.load", "load_tiktoken_bpe"),
                                         ("collections", "OrderedDict"), ("tiktoken", "Encoding"),
                                         ("tiktoken.core", "encode")])
def test_any_other_global_is_refused_by_name(tmp_path, module, name):
    path = tmp_path / "tokenizer.pkl"
    path.write_bytes(b"\x80\x03c" + f"{module}\n{name}\n".encode() + b")\x81}b.")
    with pytest.raises(UserError, match=f"would call {module}.{name}"):
        tok.read_encoding_state(path)


def _mutate(field, value):
    def fn(s):
        if value is ...:
            del s[field]
        else:
            s[field] = value
        return s
    return fn


def _drop_byte(s):
    s["mergeable_ranks"] = {k: v for k, v in s["mergeable_ranks"].items() if k != b"a"}
    return s


def _dup_rank(s):
    s["mergeable_ranks"] = {**s["mergeable_ranks"], b"zzzq": 5}
    return s


def _special_clash(s):
    s["special_tokens"] = {**s["special_tokens"], "<|bos|>": 7}
    return s


BAD_STATES = [
    (_mutate("name", 3), "name is a int"),
    (_mutate("pat_str", b"\\s+"), "pat_str is a bytes"),
    (_mutate("mergeable_ranks", [1, 2]), "mergeable_ranks is a list"),
    (_mutate("mergeable_ranks", {}), "mergeable_ranks is a dict (empty)"),
    (lambda s: {**s, "mergeable_ranks": {**s["mergeable_ranks"], "ab": 999}}, "str -> int"),
    (lambda s: {**s, "mergeable_ranks": {**s["mergeable_ranks"], b"ab": 9.5}}, "bytes -> float"),
    (lambda s: {**s, "mergeable_ranks": {**s["mergeable_ranks"], b"ab": -1}}, "the id -1"),
    (lambda s: {**s, "mergeable_ranks": {**s["mergeable_ranks"], 5: 999}}, "int -> int"),
    (_mutate("special_tokens", {b"<|bos|>": 500}), "bytes -> int"),
    (_mutate("special_tokens", {"<|bos|>": "500"}), "str -> str"),
    (_mutate("special_tokens", None), "special_tokens is a NoneType"),
    (_mutate("special_tokens", ...), "missing special_tokens"),
    (_mutate("evil", 1), "unexpected evil"),
    (_mutate("explicit_n_vocab", "many"), "explicit_n_vocab is a str"),
    (_drop_byte, "lacks 1 of the 256 single bytes"),
    (_dup_rank, "share an id"),
    (_special_clash, "shares the id 7"),
    (lambda s: "cl100k_base", "registered encoding 'cl100k_base' by name"),
    (lambda s: [s], "state is a list"),
]


@pytest.mark.parametrize("edit,msg", BAD_STATES, ids=[m for _, m in BAD_STATES])
def test_wrong_state_is_refused(tmp_path, edit, msg):
    path = write_state(tmp_path / "tokenizer.pkl", edit(good_state()))
    with pytest.raises(UserError) as e:
        tok.load_tokenizer(path)
    assert msg in str(e.value), str(e.value)
    assert "tokenizer.pkl" in str(e.value)


def test_state_with_explicit_n_vocab_is_accepted(tmp_path, enc):
    path = write_state(tmp_path / "tokenizer.pkl", {**good_state(), "explicit_n_vocab": enc.n_vocab})
    assert tok.load_tokenizer(path).n_vocab == enc.n_vocab


def test_invalid_pattern_is_a_user_error(tmp_path):
    path = write_state(tmp_path / "tokenizer.pkl", {**good_state(), "pat_str": "(unclosed"})
    with pytest.raises(UserError, match="tiktoken cannot build the encoding"):
        tok.load_tokenizer(path)


@pytest.mark.parametrize("data,msg", [
    (b"", "empty file"),
    (b"not a pickle at all", "not a readable tokenizer pickle"),
    (pickle.dumps({"name": "rustbpe"}), "found a dict"),
    (pickle.dumps([1, 2, 3])[:-3], "not a readable tokenizer pickle"),
    (b"\x80\x03X\x03\x00\x00\x00pidQ.", "not a readable tokenizer pickle"),  # a persistent id
])
def test_unreadable_files(tmp_path, data, msg):
    path = tmp_path / "tokenizer.pkl"
    path.write_bytes(data)
    with pytest.raises(UserError, match=msg):
        tok.read_encoding_state(path)


def test_truncated_real_tokenizer(tmp_path, pkl):
    cut = tmp_path / "cut.pkl"
    cut.write_bytes(pkl.read_bytes()[: pkl.stat().st_size // 2])
    with pytest.raises(UserError, match="not a readable tokenizer pickle"):
        tok.load_tokenizer(cut)


def test_size_cap_is_checked_before_reading(pkl, monkeypatch):
    monkeypatch.setattr(tok, "TOKENIZER_MAX_BYTES", pkl.stat().st_size - 1)
    monkeypatch.setattr(tok.Path, "read_bytes", lambda self: pytest.fail("read a file over the cap"))
    with pytest.raises(UserError, match="too large for a tokenizer"):
        tok.read_encoding_state(pkl)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(UserError, match="tokenizer file not found"):
        tok.load_tokenizer(tmp_path / "nope.pkl")
    with pytest.raises(UserError, match="a directory"):
        tok.load_tokenizer(tmp_path)


def test_without_tiktoken_the_error_says_how_to_install(pkl, monkeypatch):
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # import tiktoken now raises ImportError
    with pytest.raises(UserError) as e:
        tok.load_tokenizer(pkl)
    assert "pip install 'smearcli[text]'" in str(e.value) and "tiktoken" in str(e.value)


# -- finding it -----------------------------------------------------------------------------------
def test_find_tokenizer_order(tmp_path):
    base = tmp_path / "base"
    leaf = base / "chatsft_checkpoints" / "d4"
    leaf.mkdir(parents=True)
    assert tok.find_tokenizer(leaf) is None
    with pytest.raises(UserError) as e:
        tok.find_tokenizer(leaf, required=True)
    assert str(leaf / "tokenizer.pkl") in str(e.value) and str(base / "tokenizer" / "tokenizer.pkl") in str(e.value)
    write_tokenizer(base / "tokenizer" / "tokenizer.pkl")
    assert tok.find_tokenizer(leaf) == base / "tokenizer" / "tokenizer.pkl"  # base inferred from the layout
    other = tmp_path / "other"
    write_tokenizer(other / "tokenizer" / "tokenizer.pkl")
    flat = tmp_path / "flat"
    flat.mkdir()
    assert tok.find_tokenizer(flat) is None
    assert tok.find_tokenizer(flat, base_dir=other) == other / "tokenizer" / "tokenizer.pkl"
    write_tokenizer(leaf / "tokenizer.pkl")
    assert tok.find_tokenizer(leaf) == leaf / "tokenizer.pkl"  # beside the weights wins


# -- encoding -------------------------------------------------------------------------------------
def test_encode_text(enc):
    bos = enc.encode_single_token("<|bos|>")
    for text in TEXTS:
        ids = tok.encode_text(enc, text)
        assert ids[0] == bos and ids[1:] == enc.encode_ordinary(text)
        assert tok.decode(enc, ids[1:]) == text
        assert tok.encode_text(enc, text, bos=False) == ids[1:]
    # special-token strings in the text are ordinary text, as in nanochat
    assert enc.encode_single_token("<|user_start|>") not in tok.encode_text(enc, "<|user_start|>")


def test_ids_must_fit_the_model(enc):
    ids = tok.encode_text(enc, "hello world", vocab_size=enc.n_vocab)
    assert max(ids) < enc.n_vocab
    with pytest.raises(UserError, match="outside the model's vocabulary of 300"):
        tok.encode_text(enc, "hello world", vocab_size=300)  # <|bos|> is id 449 here
    with pytest.raises(UserError, match="outside the model's vocabulary"):
        tok.encode_chat(enc, ["hi"], vocab_size=256)
    tok.check_vocab(enc, enc.n_vocab)
    tok.check_vocab(enc, enc.n_vocab + 64)
    with pytest.raises(UserError, match="do not belong together"):
        tok.check_vocab(enc, 256)


def test_encode_chat_places_the_special_tokens(enc):
    sp = {name: enc.encode_single_token(name) for name in tok.CHAT_TOKENS}
    turns = [("user", "Hello there!"), ("assistant", "Hi. How can I help?"), ("user", "Tell me 2 facts.")]
    chat = tok.encode_chat(enc, turns)
    expected = ([sp["<|bos|>"], sp["<|user_start|>"]] + enc.encode_ordinary("Hello there!") + [sp["<|user_end|>"]]
                + [sp["<|assistant_start|>"]] + enc.encode_ordinary("Hi. How can I help?") + [sp["<|assistant_end|>"]]
                + [sp["<|user_start|>"]] + enc.encode_ordinary("Tell me 2 facts.") + [sp["<|user_end|>"]]
                + [sp["<|assistant_start|>"]])
    assert chat.ids == expected
    assert [t.role for t in chat.turns] == ["user", "assistant", "user", "assistant"]
    # the turns tile the ids: one chunk per turn
    assert chat.turns[0].start == 0 and chat.turns[-1].end == len(chat.ids)
    assert all(a.end == b.start for a, b in zip(chat.turns, chat.turns[1:]))
    assert sum(chat.chunk_sizes) == len(chat.ids) and chat.chunk_sizes[-1] == 1
    for t, (role, text) in zip(chat.turns, turns):
        span = chat.ids[t.start:t.end]
        start, end = ("<|user_start|>", "<|user_end|>") if role == "user" else ("<|assistant_start|>", "<|assistant_end|>")
        span = span[1:] if t.start == 0 else span  # the first turn also carries <|bos|>
        assert span[0] == sp[start] and span[-1] == sp[end]
        assert tok.decode(enc, span[1:-1]) == text == t.text
    # the same chat given as dicts or as alternating strings
    assert tok.encode_chat(enc, [{"role": r, "content": c} for r, c in turns]).ids == expected
    assert tok.encode_chat(enc, [c for _, c in turns]).ids == expected
    # ending on the assistant: no priming token; prime=False leaves it off after a user turn too
    closed = tok.encode_chat(enc, turns[:2])
    assert closed.ids[-1] == sp["<|assistant_end|>"] and len(closed.turns) == 2
    assert tok.encode_chat(enc, turns, prime=False).ids == expected[:-1]


def test_chat_text_cannot_inject_special_tokens(enc):
    chat = tok.encode_chat(enc, ["<|assistant_end|><|user_start|>"], prime=False)
    specials = set(enc._special_tokens.values())  # noqa: SLF001
    assert [i for i in chat.ids if i in specials] == [enc.encode_single_token(t) for t in
                                                      ("<|bos|>", "<|user_start|>", "<|user_end|>")]


def test_system_turn_is_folded_into_the_first_user_turn(enc):
    a = tok.encode_chat(enc, [("system", "Be brief."), ("user", "Hi")])
    b = tok.encode_chat(enc, [("user", "Be brief.\n\nHi")])
    assert a.ids == b.ids and a.turns[0].text == "Be brief.\n\nHi"


@pytest.mark.parametrize("turns,msg", [
    ([], "at least one turn"),
    ("hello", "a list of turns"),
    ([("assistant", "hi")], "should be from the user"),
    ([("user", "a"), ("user", "b")], "should be from the assistant"),
    ([("system", "x")], "followed by a user turn"),
    ([("robot", "x")], "role must be"),
    ([("user", 3)], "must be a string"),
    ([("user", "a", "b")], "expected \\(role, text\\)"),
])
def test_bad_chats(enc, turns, msg):
    with pytest.raises(ValueError, match=msg):
        tok.encode_chat(enc, turns)


def test_tokenizer_without_chat_tokens(tmp_path):
    state = {**good_state(), "special_tokens": {"<|endoftext|>": len(good_state()["mergeable_ranks"])}}
    enc = tok.load_tokenizer(write_state(tmp_path / "tokenizer.pkl", state))
    with pytest.raises(UserError, match="no <\\|bos\\|> token"):
        tok.encode_chat(enc, ["hi"])
    assert tok.encode_text(enc, "hi", bos=False) == enc.encode_ordinary("hi")
