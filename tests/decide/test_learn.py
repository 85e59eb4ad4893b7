"""What the queue learns: solo times, and co-location slowdowns from the prior to the measured."""

from __future__ import annotations

from memgov.decide.learn import PRIOR_ALPHA, Learned


def test_the_prior_is_mild_and_says_k_jobs_slow_each_other_by_a_linear_step() -> None:
    learned = Learned()
    assert learned.slowdown("a", []) == 1.0
    assert learned.slowdown("a", ["b", "c"]) == 1 + 2 * PRIOR_ALPHA


def test_a_run_alone_is_a_solo_time_and_a_shared_one_moves_the_pair_towards_what_it_showed() -> (
    None
):
    learned = Learned()
    learned.finished("job-a", "a", 10.0, {}, None)
    assert learned.expected("job-a", "a", None) == 10.0
    assert learned.expected("other", "a", None) == 10.0  # its kind's, without its own
    assert learned.expected("other", "a", 3.0) == 3.0  # a hint before the kind
    for _ in range(20):  # beside one b for its whole run, it took 3x its solo time
        learned.finished("job-a", "a", 30.0, {"b": 1.0}, 10.0)
    assert abs(learned.pair("a", "b") - 2.0) < 0.01
    assert learned.pair("b", "a") == PRIOR_ALPHA  # learned per direction
    assert learned.expected("job-a", "a", None) == 10.0  # shared runs are not solo times


def test_a_damaged_learned_file_is_dropped_not_trusted() -> None:
    bad = {
        "version": 1,
        "solo": {"x": ["1", -2, 3.0]},
        "alpha": {"a|b": "big", "c|d": 99},
        "util": {"x": 5},
    }
    learned = Learned.from_json(bad)
    assert learned.solo == {"x": [3.0]} and learned.alpha == {"c|d": 10.0}
    assert learned.util == {}
    assert Learned.from_json({"version": 2}).alpha == {}
    assert Learned.from_json(None).solo == {}
