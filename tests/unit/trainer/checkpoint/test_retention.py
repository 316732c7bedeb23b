"""Which checkpoints are kept (trainer/checkpoint/retention.py): the last k, the best k by a metric
and the pinned ones, against a plain reading of the rule over many generated cases.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.checkpoint import CheckpointError, CheckpointInfo, select_kept

# -- retention --------------------------------------------------------------------------


def _expected_kept(infos: list[CheckpointInfo], keep_last: int, keep_best: int, mode: str) -> set[int]:
    """An independent oracle: count, for each checkpoint, how many beat it."""
    verified = [c for c in infos if c.verified]
    scored = [c for c in verified if c.metric is not None and not math.isnan(c.metric)]

    def beats(d: CheckpointInfo, c: CheckpointInfo) -> bool:
        better = d.metric < c.metric if mode == "min" else d.metric > c.metric  # type: ignore[operator]
        return better or (d.metric == c.metric and d.step > c.step)

    last = {c.step for c in verified if sum(d.step > c.step for d in verified) < keep_last}
    best = {c.step for c in scored if sum(beats(d, c) for d in scored) < keep_best}
    kept = last | best | {c.step for c in infos if c.pinned}
    if verified and not kept & {c.step for c in verified}:
        kept.add(max(c.step for c in verified))
    return kept


_metrics = st.one_of(st.none(), st.just(math.nan), st.sampled_from([0.0, 1.0, 2.0]), st.floats(-10, 10))


@settings(max_examples=300, deadline=None)
@given(
    data=st.lists(
        st.tuples(st.booleans(), st.booleans(), _metrics), max_size=12
    ).flatmap(
        lambda rows: st.tuples(
            st.just(rows), st.lists(st.integers(0, 10_000), min_size=len(rows), max_size=len(rows), unique=True)
        )
    ),
    keep_last=st.integers(0, 5),
    keep_best=st.integers(0, 5),
    mode=st.sampled_from(["min", "max"]),
)
def test_select_kept_matches_last_best_and_pinned(
    data: tuple[list[tuple[bool, bool, float | None]], list[int]], keep_last: int, keep_best: int, mode: str
) -> None:
    rows, steps = data
    infos = [CheckpointInfo(s, verified=v, pinned=p, metric=m) for s, (v, p, m) in zip(steps, rows, strict=True)]
    kept = select_kept(infos, keep_last, keep_best, mode)  # type: ignore[arg-type]
    assert kept == _expected_kept(infos, keep_last, keep_best, mode)
    if any(c.verified for c in infos):
        assert kept & {c.step for c in infos if c.verified}


def test_select_kept_examples() -> None:
    infos = [
        CheckpointInfo(100, True, metric=0.9),
        CheckpointInfo(200, True, metric=0.5),
        CheckpointInfo(300, True, metric=math.nan),
        CheckpointInfo(400, False, metric=0.1),  # unverified: never best, never last
        CheckpointInfo(500, True, metric=None),
        CheckpointInfo(600, False, pinned=True),
        CheckpointInfo(50, True, pinned=True, metric=2.0),
    ]
    assert select_kept(infos, keep_last=2, keep_best=1) == {500, 300, 200, 600, 50}
    assert select_kept(infos, keep_last=0, keep_best=2, best_mode="max") == {50, 100, 600}
    assert select_kept(infos, keep_last=0, keep_best=0) == {600, 50}
    nan_only = [CheckpointInfo(1, True, metric=math.nan), CheckpointInfo(2, True, metric=math.nan)]
    assert select_kept(nan_only, keep_last=0, keep_best=3) == {2}  # NaN is never best; newest kept
    assert select_kept([CheckpointInfo(1, False), CheckpointInfo(2, False)], 3, 3) == set()
    assert select_kept([], 3, 3) == set()
    with pytest.raises(CheckpointError, match="keep_last=-1"):
        select_kept(infos, keep_last=-1, keep_best=0)
