# SPDX-License-Identifier: Apache-2.0
"""StopCriteria and TextStream against a plain token-by-token simulation."""

import random

import pytest

from dspark.decoding.stopping import StopCriteria, TextStream


class CharTokenizer:
    """Token i decodes to a fixed short string; id 0 is EOS, id 9 is half of a two-token character."""

    pieces = {
        0: "</s>",
        1: "a",
        2: "b",
        3: "ab",
        4: " ",
        5: "c",
        6: "ST",
        7: "OP",
        8: "x",
        9: "\xc3",
        10: "\xa9",
    }

    def decode(self, ids, skip_special_tokens=False):
        raw = "".join(self.pieces[i] for i in ids if not (skip_special_tokens and i == 0))
        # ids 9 then 10 form "é" (like a UTF-8 byte pair); a lone 9 decodes to the replacement character
        return raw.replace("\xc3\xa9", "é").replace("\xc3", "\ufffd").replace("\xa9", "\ufffd")


def one_by_one(tokens, max_new, eos, stop, tok):
    """Plain decoding's stop rule, one token at a time."""
    out = []
    for t in tokens:
        out.append(t)
        if t in eos or len(out) >= max_new or any(s in tok.decode(out) for s in stop):
            break
    return out


def test_rounds_match_token_by_token():
    tok = CharTokenizer()
    for seed in range(300):
        rng = random.Random(seed)
        stream = [rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 0 if rng.random() < 0.1 else 1]) for _ in range(40)]
        max_new = rng.randint(1, 40)
        stop = rng.choice([[], ["STOP"], ["ab c", "xx"], ["b"]])
        want = one_by_one(stream, max_new, {0}, stop, tok)
        sc = StopCriteria(max_new, [0], stop, tok)
        i = 0
        while not sc.finished and i < len(stream):
            n = rng.randint(1, 8)
            sc.commit(stream[i : i + n])
            i += n
        assert sc.generated == want, seed
        if sc.finish_reason == "eos":
            assert want[-1] == 0
        elif sc.finish_reason == "stop":
            assert any(s in tok.decode(want) for s in stop)
            assert not any(s in tok.decode(want[:-1]) for s in stop)
        elif sc.finish_reason == "length":
            assert len(want) == max_new
        else:
            assert len(want) == len(stream)


def test_refuses_bad_arguments():
    with pytest.raises(ValueError, match="max_new_tokens"):
        StopCriteria(0)
    with pytest.raises(ValueError, match="tokenizer"):
        StopCriteria(5, stop=["x"])
    with pytest.raises(ValueError, match="non-empty"):
        StopCriteria(5, stop=[""], tokenizer=CharTokenizer())
    sc = StopCriteria(1)
    sc.commit([1, 2])
    assert sc.generated == [1] and sc.finish_reason == "length"
    with pytest.raises(RuntimeError, match="already finished"):
        sc.commit([1])


def test_text_stream_holds_back_half_characters():
    ts = TextStream(CharTokenizer())
    assert ts.push([1, 9]) == "a"  # the lone first half is held back
    assert ts.push([10, 2]) == "éb"
    assert ts.push([0], final=True) == ""  # EOS is a special token
