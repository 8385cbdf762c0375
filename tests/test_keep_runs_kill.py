"""`[state] keep_runs_days` under SIGKILL: a real `overnight run` killed while it removes old runs leaves whole runs only.

The machinery (seeding, aiming, the checks) is bench/kill_old_runs.py's, which `bench/kill.py --old-runs` runs 50 times by default.
"""

from __future__ import annotations

import random

from bench.kill_old_runs import kill_in_removal, removal_time, rest_removed, seed_old_runs, set_up
from tests.test_night import FIX, overnight

KILLS = 5
# A kill that lands after the removal (the removal was timed while the machine was busier) is checked too, but does
# not count, and the next is aimed within half the time.
ATTEMPTS = 12


class TestKilledWhileRemoving:
    def test_each_kill_leaves_every_old_run_whole_or_gone_and_the_next_night_removes_the_rest(self, tmp_path, server):
        """SIGKILLed at random moments of the removal, a night leaves each seeded old run with all its rows or none, no
        row without its parent and a sound database; the next night removes the rest, keeps the others and exits 0."""
        setup = set_up(tmp_path, server)
        within_s = removal_time(setup)
        seed = random.randrange(2**32)  # each run aims anew; a failure names its seed
        rng = random.Random(seed)
        landings = []
        while len(landings) < ATTEMPTS and sum(landing.inside for landing in landings) < KILLS:
            seeded = seed_old_runs(setup)
            landing, torn = kill_in_removal(setup, seeded, within_s, rng)
            assert torn == [], (seed, landing, torn)
            server.enqueue(*FIX)
            assert overnight("run", "--config", str(setup.config)) == 0
            assert rest_removed(setup) == [], (seed, landing)
            landings.append(landing)
            if not landing.inside:
                within_s /= 2
        assert sum(landing.inside for landing in landings) == KILLS, (seed, landings)
        # Some kills came after a batch was committed: they reached past the first transaction.
        assert any(landing.inside and landing.removed for landing in landings), (seed, landings)
