import math

import pytest

from swarmrl.trainer.advantages import group_advantages, has_signal


def test_advantages_hand_computed():
    # rewards 0, 1, 1, 0 -> mean 0.5, population std 0.5 -> ±1
    adv = group_advantages([0.0, 1.0, 1.0, 0.0])
    assert adv == pytest.approx([-1.0, 1.0, 1.0, -1.0], rel=1e-5)
    # rewards 1, 2, 3 -> mean 2, std sqrt(2/3)
    s = math.sqrt(2 / 3)
    assert group_advantages([1.0, 2.0, 3.0]) == pytest.approx([-1 / s, 0.0, 1 / s], rel=1e-5)


def test_equal_rewards_have_no_signal():
    assert group_advantages([0.3] * 4) == pytest.approx([0.0] * 4)
    assert not has_signal([0.3] * 4)
    assert has_signal([0.3, 0.3, 0.31])
