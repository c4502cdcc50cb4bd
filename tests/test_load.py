"""Two replicas on one real PostgreSQL under load, one killed while a job runs on it (bench/load.py, smaller)."""

from __future__ import annotations

import sys
from pathlib import Path

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))

from load import print_report, run_load


def test_killing_a_replica_mid_run_loses_no_plan_and_no_job(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    # Clients pause between requests, so the run is still going when a job is running on the replica killed.
    report = run_load(clients=4, requests=80, jobs=2, kill_at=0.4, work=tmp_path, kill_a_running_job=True,
                      think=0.3)  # fmt: skip
    print_report(report, 4, 80)
    assert report.server_errors == 0, report.statuses
    assert report.answered_not_stored == 0 and report.duplicated == 0
    assert report.distinct_plans == 6 and not report.client_errors
    # Every job ended, done (a job that was running on the killed replica is retried by the other one) or
    # failed with its reason; none is left queued or running.
    assert len(report.jobs) == 2 and all(state in ("done", "failed") for state, _, _ in report.jobs.values())
    assert all(why for state, _, why in report.jobs.values() if state == "failed"), report.jobs
    assert report.killed_after < 4 * 80
    # The job running on the killed replica ran again on the other one.
    assert any(attempt > 1 for _, attempt, _ in report.jobs.values()), report.jobs
