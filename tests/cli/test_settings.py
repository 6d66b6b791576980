"""The config file: everything it can set, and one-line errors naming the bad key."""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor.errors import ConfigError
from auditor.settings import Config, Thresholds, load_config

FULL = """
currency = "EUR"

[thresholds]
idle_threshold_pct = 3
startup_cap_s = 900.5

[teams]
label = "example.com/team"
annotation = "example.com/owner"
namespaces = { "ml-prod" = "nlp" }

[prices]
default = 2.0
"NVIDIA H100 80GB HBM3" = 4.5

[cost_centres]
nlp = "CC-1001"

[retention]
raw_days = 30
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "auditor.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_full_config(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FULL))
    assert config.thresholds.idle_threshold_pct == 3.0
    assert config.thresholds.startup_cap_s == 900.5
    assert config.thresholds.teardown_cap_s == Thresholds().teardown_cap_s
    assert config.teams.label == "example.com/team"
    assert config.teams.namespace_teams == {"ml-prod": "nlp"}
    assert config.prices.for_model("NVIDIA H100 80GB HBM3") == 4.5
    assert config.prices.for_model("NVIDIA L40S") == 2.0
    assert config.prices.for_model(None) == 2.0
    assert config.prices.currency == "EUR"
    assert config.cost_centres == {"nlp": "CC-1001"}
    assert config.retention.raw_days == 30.0


def test_retention_defaults_to_two_weeks(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, 'currency = "EUR"\n')).retention.raw_days == 14.0


def test_no_config_is_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUDITOR_CONFIG", raising=False)
    assert load_config(None) == Config()


def test_env_names_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUDITOR_CONFIG", str(write(tmp_path, 'currency = "CHF"\n')))
    assert load_config(None).prices.currency == "CHF"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("colour = 1\n", "colour"),
        ("[thresholds]\nidle_treshold_pct = 5\n", "idle_treshold_pct"),
        ("[thresholds]\nstartup_cap_s = 'long'\n", "startup_cap_s"),
        ("[thresholds]\nteardown_cap_s = -1\n", "teardown_cap_s"),
        ("[teams]\nlabels = 'team'\n", "teams.labels"),
        ("[teams]\nnamespaces = { a = 1 }\n", "teams.namespaces"),
        ("[prices]\n'NVIDIA H200' = 'cheap'\n", "prices.NVIDIA H200"),
        ("[prices]\ndefault = -2\n", "prices.default"),
        ("currency = 5\n", "currency"),
        ("thresholds = 5\n", "thresholds"),
        ("[cost_centres]\nnlp = 1001\n", "cost_centres"),
        ("[retention]\nraw_days = -1\n", "retention.raw_days"),
        ("[retention]\nraw_days = 'two weeks'\n", "retention.raw_days"),
        ("[retention]\nraw_days = true\n", "retention.raw_days"),
        ("[retention]\nrollup_days = 3\n", "retention.rollup_days"),
        ("retention = 14\n", "retention"),
    ],
)
def test_bad_key_is_named(tmp_path: Path, text: str, field: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert err.value.field == field
    assert str(err.value).startswith(f"{path}: field {field!r}: ")
    assert "\n" not in str(err.value)


def test_not_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[thresholds\n"))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")


def test_readme_config_example_loads(tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    example = readme.split("```toml\n", 1)[1].split("```", 1)[0]
    config = load_config(write(tmp_path, example))
    assert config.prices.currency == "EUR"
    assert config.cost_centres == {"nlp": "CC-1001"}
