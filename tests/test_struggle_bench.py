"""The struggle benchmark: the whole library through the real loop, judged against the bars."""

from __future__ import annotations

import pytest

from bench.struggle import OURS, Row, run_library, summarise, table
from bench.trajectories import library


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    return run_library()


class TestLibrary:
    def test_library_is_big_enough(self):
        """At least 25 trajectories, at least 10 of them healthy, with unique names."""
        trajectories = library()
        assert len(trajectories) >= 25
        assert sum(1 for t in trajectories if t.healthy) >= 10
        assert len({t.name for t in trajectories}) == len(trajectories)

    def test_healthy_runs_submit(self, rows: list[Row]):
        """Every healthy script reaches submit under our guards, so it really exercises a whole run."""
        assert [r.trajectory.name for r in rows if r.trajectory.healthy and not r.ours.submitted] == []


class TestBars:
    def test_every_struggle_is_detected(self, rows: list[Row]):
        """Our guards notice every struggle in the library."""
        assert [r.trajectory.name for r in rows if not r.trajectory.healthy and r.detection(OURS) is None] == []

    def test_never_later_than_the_best_baseline(self, rows: list[Row]):
        """No baseline policy notices a struggle before ours does."""
        assert [r.trajectory.name for r in rows if r.beaten] == []

    def test_no_severe_stop_on_healthy_runs(self, rows: list[Row]):
        """Risky-looking healthy runs are never stopped."""
        assert [r.trajectory.name for r in rows if r.false_stop] == []

    def test_detection_is_at_or_after_onset(self, rows: list[Row]):
        """A detection before the struggle began would be a false flag in disguise."""
        early = [r.trajectory.name for r in rows if (d := r.detection(OURS)) and d.turn < r.trajectory.onset]
        assert early == []

    def test_overhead_is_sane(self, rows: list[Row]):
        """Guard hooks cost well under a millisecond per tool call (the 50 µs bar is the script's, not a test's)."""
        summary = summarise(rows)
        assert 0 < summary.median_us < 500

    def test_table_has_a_row_per_trajectory_and_the_baselines(self, rows: list[Row]):
        """The printed table names every trajectory and every baseline column."""
        text = table(rows)
        assert all(r.trajectory.name in text for r in rows)
        assert all(name in text.splitlines()[0] for name in ("RobotLab", "mini-me", "ttalk", "verdict"))
