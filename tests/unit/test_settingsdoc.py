"""docs/settings.md is what ``python -m tools.settingsdoc`` makes of the settings now, and
every setting is in a group, described, and listed there."""

from __future__ import annotations

from pathlib import Path

import pytest

from plumbing.settings import GROUPS, Settings, SettingsGroup, default_data_dir
from tools import settingsdoc

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def settings_md() -> str:
    return settingsdoc.DOC.read_text(encoding="utf-8")


def test_settings_md_is_generated_from_the_settings(settings_md: str) -> None:
    assert settings_md == settingsdoc.render(), (
        "docs/settings.md is stale: run `python -m tools.settingsdoc --write` and commit it"
    )


def test_every_setting_is_in_exactly_one_group() -> None:
    owners: dict[str, list[str]] = {}
    for group in GROUPS:
        for name in group.model_fields:
            owners.setdefault(name, []).append(group.__name__)
    assert set(owners) == set(Settings.model_fields), "a field of Settings outside the groups"
    assert {name: where for name, where in owners.items() if len(where) > 1} == {}
    assert all(issubclass(Settings, group) for group in GROUPS)
    assert set(GROUPS) == {b for b in Settings.__mro__ if b in SettingsGroup.__subclasses__()}


def test_every_group_has_a_title_and_a_text() -> None:
    for group in GROUPS:
        assert group.title, group.__name__
        assert group.__doc__, group.__name__
    assert len({group.title for group in GROUPS}) == len(GROUPS)


def test_every_setting_is_described_and_listed(settings_md: str) -> None:
    undescribed = [name for name, info in Settings.model_fields.items() if not info.description]
    assert undescribed == []
    for name in Settings.model_fields:
        assert f"| `SLUICEGATE_{name.upper()}` |" in settings_md


def test_the_doc_names_no_machine_dependent_default(settings_md: str) -> None:
    assert str(default_data_dir()) not in settings_md
    assert str(Path.home()) not in settings_md
    assert "The user data directory" in settings_md


def test_the_doc_does_not_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    before = settingsdoc.render()
    monkeypatch.setenv("SLUICEGATE_LAG_SOFT", "7")
    monkeypatch.setenv("SLUICEGATE_DATA_DIR", "/somewhere/else")
    assert settingsdoc.render() == before


def test_the_env_names_are_the_field_names_with_the_prefix() -> None:
    """What docs/settings.md calls a setting is what pydantic-settings reads."""
    assert Settings.model_config.get("env_prefix") == "SLUICEGATE_"
    assert Settings.model_config.get("case_sensitive") is False
    for info in Settings.model_fields.values():
        assert info.alias is None
        assert info.validation_alias is None


@pytest.mark.parametrize(
    ("annotation_of", "expected"),
    [
        ("lag_hard", "integer ≥ 1"),
        ("admission_hysteresis", "number ≥ 0, < 1"),
        ("tenant_rpm", "integer ≥ 1"),
        ("auth", "`api_key`, `tenant_header`"),
        ("webhook_retry_schedule_s", "JSON list (items: number ≥ 0), at least 1 item"),
        ("webhook_allow_networks", "JSON list (items: CIDR)"),
        ("llamacpp_model_path", "path"),
        ("deadline_aware", "`true` or `false`"),
    ],
)
def test_values_are_the_type_and_its_constraints(annotation_of: str, expected: str) -> None:
    info = Settings.model_fields[annotation_of]
    assert settingsdoc.values(info.annotation, list(info.metadata)) == expected


def test_defaults_are_written_as_the_environment_takes_them() -> None:
    fields = Settings.model_fields
    assert settingsdoc.default(fields["deadline_aware"]) == "`true`"
    assert settingsdoc.default(fields["database_url"]) == "unset"
    assert settingsdoc.default(fields["max_ttl_s"]) == "`604800`"
    assert settingsdoc.default(fields["webhook_allow_networks"]) == "`[]`"


def test_the_readme_points_at_the_settings_doc() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "(docs/settings.md)" in readme


def test_every_group_is_where_its_path_says() -> None:
    from plumbing.settings import GROUPS, Settings

    settings = Settings(lag_soft=7, llamacpp_slots=3, webhook_timeout_s=2.5)
    for group in GROUPS:
        found: object = settings
        for part in group.path.split("."):
            found = getattr(found, part)
        assert type(found) is group, group.path
        # the group's values are the settings' own, not defaults read again
        for name in group.model_fields:
            assert getattr(found, name) == getattr(settings, name), (group.path, name)
    assert (settings.admission.lag_soft, settings.engines.llamacpp.llamacpp_slots) == (7, 3)
    # a copy with a change is seen through its groups
    assert settings.model_copy(update={"lag_soft": 9}).admission.lag_soft == 9
