"""Settings' groups (``settings.api``, ``settings.worker``, ...) are made once per settings
object, and a copy with other values never keeps the groups made of the original's."""

from __future__ import annotations

import copy

from plumbing.settings import GROUPS, Settings


def test_each_group_is_made_once() -> None:
    settings = Settings()
    for group in GROUPS:
        path = group.path.split(".")[0]
        assert getattr(settings, path) is getattr(settings, path), path


def test_a_copy_with_other_values_has_groups_of_its_own_values() -> None:
    settings = Settings()
    before = (settings.api, settings.worker, settings.engines)
    copied = settings.model_copy(
        update={"api_fast_submit": False, "claim_batch": 7, "sim_num_blocks": 99}
    )
    assert copied.api.api_fast_submit is False
    assert copied.worker.claim_batch == 7
    assert copied.engines.sim.sim_num_blocks == 99
    # The original's groups are as they were, and still its own.
    assert (settings.api, settings.worker, settings.engines) == before
    assert settings.api is before[0]
    assert settings.api.api_fast_submit is True


def test_a_copy_of_a_copy_and_a_deep_copy_keep_their_values() -> None:
    settings = Settings().model_copy(update={"claim_batch": 3})
    assert settings.worker.claim_batch == 3
    again = settings.model_copy(update={"claim_batch": 5})
    assert (settings.worker.claim_batch, again.worker.claim_batch) == (3, 5)
    assert copy.deepcopy(again).worker.claim_batch == 5
    assert again.model_copy().worker.claim_batch == 5


def test_groups_are_not_settings_of_their_own() -> None:
    """A group made once is not a field: not dumped, not compared."""
    settings = Settings()
    settings.api  # noqa: B018 (made)
    assert "api" not in settings.model_dump()
    assert settings == Settings()
