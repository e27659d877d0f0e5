import pytest

from ansible_collections.llmops.vllm.plugins.module_utils.common.wait import WaitAborted, positive_seconds, wait_for


class FakeClock:
    """A clock that only moves when the wait sleeps, so the test sees every poll's time."""

    def __init__(self):
        self.now = 100.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def test_done_at_first_poll_returns_without_sleeping():
    clock = FakeClock()
    result = wait_for(lambda: (True, "ready"), timeout=10, interval=1, clock=clock, sleep=clock.sleep)
    assert (result.ok, result.observed, result.polls, result.elapsed) == (True, "ready", 1, 0)
    assert clock.sleeps == []


def test_consecutive_successes_are_required_and_a_miss_restarts_the_count():
    answers = iter([True, False, True, True, True])
    clock = FakeClock()
    result = wait_for(
        lambda: (next(answers), None), timeout=60, interval=2, consecutive=3, clock=clock, sleep=clock.sleep
    )
    assert result.ok and result.polls == 5 and result.elapsed == 8


def test_timeout_keeps_the_last_observation_and_polls_at_the_deadline():
    seen = iter(range(100))
    clock = FakeClock()
    result = wait_for(lambda: (False, next(seen)), timeout=5, interval=2, clock=clock, sleep=clock.sleep)
    assert not result.ok and result.aborted is None
    # Polls at 0, 2, 4 and at the deadline 5: the last sleep is shortened to end exactly there.
    assert clock.sleeps == [2, 2, 1] and result.polls == 4 and result.observed == 3 and result.elapsed == 5


def test_abort_ends_the_wait_at_once_with_the_reason():
    def check():
        raise WaitAborted("unit failed", observed={"result": "exit-code"})

    clock = FakeClock()
    result = wait_for(check, timeout=600, interval=1, clock=clock, sleep=clock.sleep)
    assert not result.ok and result.aborted == "unit failed" and result.observed == {"result": "exit-code"}
    assert clock.sleeps == []


@pytest.mark.parametrize("value", [0, -1, "0", -0.5])
def test_positive_seconds_refuses_zero_and_negative(value):
    with pytest.raises(ValueError, match="stop_timeout must be more than 0 seconds"):
        positive_seconds(value, "stop_timeout")


def test_positive_seconds_accepts_strings_and_fractions():
    assert positive_seconds("2.5", "interval") == 2.5
