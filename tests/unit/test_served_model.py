"""Which model a result names: the one its engine served, as the engine names it; and the
names a local stack's API takes, so a request for another model is refused."""

from __future__ import annotations

from pathlib import Path

from plumbing.settings import Settings
from sluicegate.local.model import served_names
from workers.engines.llamacpp.engine import served_name
from workers.engines.llamacpp.server import served_model_name

GGUF = "/data/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_llamacpp_names_its_model_by_its_alias_else_its_file() -> None:
    assert served_model_name(Path(GGUF)) == "SmolLM2-135M-Instruct.Q4_1"
    # As `sluicegate llama-server` starts it: the alias is the file's stem.
    assert served_name({"model_path": GGUF, "model_alias": "SmolLM2-135M-Instruct.Q4_1"}) == (
        "SmolLM2-135M-Instruct.Q4_1"
    )
    assert served_name({"model_path": GGUF, "model_alias": ["my-model"]}) == "my-model"
    # A server started without an alias answers with the path: its file's name is reported.
    assert served_name({"model_path": GGUF, "model_alias": GGUF}) == (
        "SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    assert served_name({"model_path": GGUF}) == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert served_name({}) == "llamacpp"


def test_a_local_stack_takes_only_its_engines_names(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, llamacpp_model_path=Path(GGUF))
    assert served_names(settings, "sim") == ["sim"]
    assert served_names(settings, "llamacpp") == ["llamacpp", "SmolLM2-135M-Instruct.Q4_1"]
    assert "sim" not in served_names(settings, "llamacpp")
    assert served_names(settings, "vllm_http") == ["vllm_http", settings.vllm_model]
