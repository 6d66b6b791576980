"""An error is one line of at most `MAX_LINE` characters, and a cut one ends on a whole word."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from auditor.errors import MAX_LINE, InputError, cut_at_word


def test_a_long_message_is_cut_after_a_whole_word() -> None:
    message = (
        "missing required column 'memory.used': the file must have timestamp, utilization.gpu,"
        " memory.used (nvidia-smi --query-gpu=timestamp,uuid,index,utilization.gpu,memory.used,"
        "memory.total --format=csv -l 5)"
    )
    text = str(InputError(message * 2, file="/logs/node-a.csv", line=1, field="memory.used"))
    assert len(text) <= MAX_LINE
    assert text.endswith("…")
    last = text[:-1].rsplit(" ", maxsplit=1)[-1]
    assert (message * 2).split(" ").count(last) >= 1  # a word of the message, not a piece


def test_a_message_that_fits_is_whole_and_one_word_too_long_is_cut_where_it_fits() -> None:
    assert cut_at_word("short enough", 40) == "short enough"
    assert cut_at_word("x" * 100, 40) == "x" * 39 + "…"


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab ,:("), max_size=400), st.integers(40, 300))
def test_the_cut_is_a_prefix_within_room(message: str, room: int) -> None:
    out = cut_at_word(message, room)
    assert len(out) <= room
    if out != message:
        head = out.removesuffix("…")
        assert message.startswith(head)
        after = message[len(head) :]
        # ended on a word boundary, or no space was near enough to the limit
        assert after[:1] in {" ", ",", ";", ":", "("} or " " not in message[room - 41 : room - 1]
