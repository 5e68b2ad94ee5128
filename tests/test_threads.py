"""The chapters' thread count is chosen in one place: `seed_everything` sets it."""

import pytest
import torch

from attention_course import seed_everything
from attention_course.device import CHAPTER_THREADS


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_seed_everything_sets_the_chapter_threads(restore_threads):
    torch.set_num_threads(2)
    seed_everything(0)
    assert CHAPTER_THREADS == 1 and torch.get_num_threads() == CHAPTER_THREADS


def test_threads_none_leaves_the_count_and_other_counts_are_set(restore_threads):
    torch.set_num_threads(2)
    seed_everything(0, threads=None)
    assert torch.get_num_threads() == 2
    seed_everything(0, threads=3)
    assert torch.get_num_threads() == 3


@pytest.mark.parametrize("bad", [0, -1, 1.0, True, "1"])
def test_bad_thread_counts_are_refused(bad, restore_threads):
    with pytest.raises(ValueError, match="threads: got"):
        seed_everything(0, threads=bad)


def test_the_benchmark_behind_the_choice_runs(restore_threads):
    # not a timing test: the script runs, and reports every workload against one thread
    from benchmarks.threads import WORKLOADS, main

    results = main(["--quick", "--json"])
    assert [r["workload"] for r in results] == list(WORKLOADS)
    for r in results:
        assert r["threads"][1]["ratio_to_1"] == 1.0
        assert all(row["median_ms"] > 0 for row in r["threads"].values())
