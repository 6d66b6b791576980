"""The simulator's SPEC §7 truth of a shared card (`shared_card_truth`): bounded properties.

- one tenant holding the whole card gets what the exclusive-card truth (`card_truth`, labels
  by construction) gives it, category by category;
- every card sums to its window with random tenants, shares and activities, and a tenant
  that stays within its share holds share × time.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auditor.model import CATEGORIES
from auditor.settings import Thresholds
from auditor.simulate.plan import Label
from auditor.simulate.sharedtruth import Holder, shared_card_truth
from auditor.simulate.truth import Tenure, card_truth

PERIOD = 5_000
T0 = 1_795_000_000_000


def _as_dict(result: tuple[np.ndarray, np.ndarray, np.ndarray]) -> dict[tuple[int, str], float]:
    pods, cats, secs = result
    out: dict[tuple[int, str], float] = {}
    for p, c, s in zip(pods.tolist(), cats.tolist(), secs.tolist(), strict=True):
        out[p, CATEGORIES[c].value] = out.get((p, CATEGORIES[c].value), 0.0) + s
    return out


@st.composite
def exclusive_tenure(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int, int | None, int]:
    """(util %, labels, bound ms, released ms or None, trailing run's first tick) of one card
    held once: an idle lead, active spells parted by short stalls or long absences, and a
    trailing idle run when the tenure closes."""
    lead = draw(st.integers(1, 500))
    util: list[int] = [0] * lead
    label: list[int] = [Label.LEAD] * lead
    for _ in range(draw(st.integers(1, 4))):
        n = draw(st.integers(3, 200))
        util += draw(st.lists(st.integers(6, 100), min_size=n, max_size=n))
        label += [Label.ACTIVE] * n
        gap = draw(st.sampled_from([0, 1, 2, 3, 400, 700]))
        util += [0] * gap
        label += [Label.STALL if gap < 400 else Label.RESERVED] * gap
    while label[-1] != Label.ACTIVE:  # the spells end active; the trailing run is apart
        util.pop()
        label.pop()
    closed = draw(st.booleans())
    trail = len(util)
    if closed:
        tail = draw(st.integers(1, 300))
        util += [0] * tail
        label += [Label.TRAIL] * tail
    pre = draw(st.integers(1, 50))  # unheld samples before binding
    after = draw(st.integers(1, 50)) if closed else 0
    u = np.array([0] * pre + util + [0] * after, dtype=np.int16)
    lab = np.array([Label.UNHELD] * pre + label + [Label.UNHELD] * after, dtype=np.int8)
    bound = T0 + (pre - 1) * PERIOD + draw(st.integers(1, PERIOD - 1))
    released = T0 + (pre + len(util)) * PERIOD - draw(st.integers(0, PERIOD - 1))
    return u, lab, bound, released if closed else None, pre + trail


@settings(max_examples=30, deadline=None)
@given(exclusive_tenure())
def test_one_tenant_with_the_whole_card_is_the_exclusive_truth(
    case: tuple[np.ndarray, np.ndarray, int, int | None, int],
) -> None:
    util, label, bound, released, trail = case
    n = util.size
    ts = T0 + np.arange(n, dtype=np.int64) * PERIOD
    th = Thresholds()
    window = (int(ts[0]), int(ts[-1]) + PERIOD)
    trail_ms = None if released is None else int(ts[trail])
    lead = Label.RESERVED if (label != Label.ACTIVE).all() else Label.LEAD
    exclusive = card_truth(
        ts=ts,
        present=np.ones(n, dtype=bool),
        util=util,
        label=np.where(label == Label.UNHELD, Label.LEAD, label).astype(np.int8),
        strag=np.zeros(n, dtype=np.float32),
        tenures=[Tenure(0, bound, released, lead, trail_ms)],
        window=window,
        thresholds=th,
    )
    act = np.where(label == Label.UNHELD, 0, util) / 100.0
    shared = shared_card_truth(
        ts=ts,
        util=util / 100.0,
        activity=act[None, :],
        holders=[Holder(0, 1.0, bound, released)],
        window=window,
        data_end_ms=window[1],
        thresholds=th,
    )
    want, got = _as_dict(exclusive), _as_dict(shared)
    for key in set(want) | set(got):
        assert got.get(key, 0.0) == pytest.approx(want.get(key, 0.0), abs=1e-6), key


@st.composite
def shared_card(draw: st.DrawFn) -> tuple[np.ndarray, list[Holder], int]:
    """(activity per tenant and sample, holders, samples): tenants within their shares."""
    n = draw(st.integers(20, 200))
    k = draw(st.integers(1, 4))
    raw = draw(st.lists(st.integers(1, 100), min_size=k, max_size=k))
    scale = max(1.0, sum(raw) / 100)
    holders = []
    act = np.zeros((k, n))
    for i, r in enumerate(raw):
        share = r / 100 / scale
        a = draw(st.integers(0, n - 2))
        b = draw(st.integers(a + 1, n))
        bound = T0 + a * PERIOD + draw(st.integers(0, PERIOD - 1))
        released = None if b == n else T0 + b * PERIOD - draw(st.integers(0, PERIOD - 1))
        holders.append(Holder(i, share, bound, released))
        level = draw(st.floats(0.0, 1.0))
        act[i, a + 1 : max(a + 1, b - 1)] = level * share
    return act, holders, n


@settings(max_examples=40, deadline=None)
@given(shared_card())
def test_a_shared_card_sums_to_its_window_and_tenants_to_their_shares(
    case: tuple[np.ndarray, list[Holder], int],
) -> None:
    act, holders, n = case
    ts = T0 + np.arange(n, dtype=np.int64) * PERIOD
    window = (int(ts[0]), int(ts[-1]) + PERIOD)
    for estimated in (False, True):
        pods, _, secs = shared_card_truth(
            ts=ts,
            util=act.sum(axis=0),
            activity=act,
            holders=holders,
            window=window,
            data_end_ms=window[1],
            thresholds=Thresholds(),
            estimated=estimated,
        )
        assert secs.sum() == pytest.approx((window[1] - window[0]) / 1000, rel=1e-9)
        assert (secs >= -1e-9).all()
        for h in holders:
            end = window[1] if h.released_ms is None else min(h.released_ms, window[1])
            held = h.share * max(0, end - max(h.bound_ms, window[0])) / 1000
            assert secs[pods == h.pod].sum() == pytest.approx(held, rel=1e-9, abs=1e-6)
