"""Time to first token per slice per pool: the median of the newest requests in the
window, none under ``min_samples``."""

from __future__ import annotations

from gateway.measure.slicerecord import TTFT_KEPT, SliceRecord


def test_the_median_of_the_newest_requests_within_the_window() -> None:
    entry = SliceRecord("m", "r", window_s=60.0)
    for i, seconds in enumerate((0.2, 9.0, 0.3, 0.4)):
        entry.first_token("spec", seconds, float(i))
    entry.first_token("standard", 0.25, 1.0)
    assert entry.ttft_p50("spec", 5.0, 3) == (0.35, 4)
    assert entry.ttft_p50("standard", 5.0, 3) is None  # one request: no judgement
    assert entry.ttft_p50("spec", 61.5, 1) == (0.35, 2)  # the first two left the window
    for i in range(TTFT_KEPT):
        entry.first_token("spec", 1.0, 70.0 + i)
    assert entry.ttft_p50("spec", 70.0 + TTFT_KEPT, 3) == (1.0, TTFT_KEPT)
