"""The fast path's integer fields, many at once (``decoders.decode_ints``), are exactly what the
general way reads one by one (``decode_int``): the same values, and refused where it raises."""

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dali_shards.worker.decoders import INT_TEXT_BYTES, decode_int, decode_ints

SPACE = st.sampled_from(list(" \t\n\r\f\v"))
TEXT_INT = st.builds(
    lambda pre, sign, digits, post: f"{pre}{sign}{digits}{post}",
    st.text(SPACE, max_size=4), st.sampled_from(["", "+", "-"]),
    st.one_of(st.integers(0, 10**25).map(str), st.text(st.sampled_from("0123456789"), min_size=1, max_size=30)),
    st.text(SPACE, max_size=4),
)
ANY = st.one_of(TEXT_INT, st.text(st.sampled_from(" \t+-0123456789x.é\0"), max_size=70))


def expected(text: bytes):
    try:
        return decode_int(text)
    except ValueError:
        return None


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(TEXT_INT, ANY).map(lambda t: t.encode()), min_size=1, max_size=12))
@example([b"7" + b" " * 63 + b"8", b"0" * 64 + b"5", b"", b" ", b"+", b"-0", b"9223372036854775807",
          b"-9223372036854775808", b"9223372036854775808", b"123456789012345678", b"1234567890123456789"])
def test_many_integers_at_once_read_as_each_alone(texts):
    gap = b"#"  # something between the texts that is not one
    buf = np.frombuffer(gap + gap.join(texts) + gap, dtype=np.uint8)
    at, pos = [], 1
    for t in texts:
        at.append(pos)
        pos += len(t) + 1
    values, ok = decode_ints(buf, np.array(at, np.int64), np.array([len(t) for t in texts], np.int64))
    for t, v, good in zip(texts, values.tolist(), ok.tolist()):
        want = expected(t)
        assert good == (want is not None), t
        if good:
            assert v == want, t
    assert all(len(t) <= INT_TEXT_BYTES for t, good in zip(texts, ok) if good)


def test_no_texts():
    values, ok = decode_ints(np.zeros(4, np.uint8), np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert values.shape == ok.shape == (0,)
