"""get_device, seed_everything and the ``attention-course doctor`` command."""

from __future__ import annotations

import importlib.metadata
import random

import numpy as np
import pytest
import torch

from attention_course import get_device, seed_everything
from attention_course.cli import main
from attention_course.device import ENV_VAR


def automatic_choice() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    return monkeypatch


# --- get_device ---------------------------------------------------------------------------


def test_get_device_picks_cuda_then_mps_then_cpu(no_env):
    assert get_device() == automatic_choice()
    assert isinstance(get_device(), torch.device)


@pytest.mark.parametrize("prefer", ["cpu", torch.device("cpu")])
def test_get_device_respects_prefer(no_env, prefer):
    assert get_device(prefer) == torch.device("cpu")


def test_environment_variable_overrides_prefer(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "cpu")
    assert get_device() == torch.device("cpu")
    assert get_device("cuda:1000") == torch.device("cpu")  # prefer is not even looked at


def test_empty_environment_variable_counts_as_unset(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "")
    assert get_device() == automatic_choice()
    assert get_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_get_device_returns_an_existing_cuda_device(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "cuda:0")
    assert get_device() == torch.device("cuda:0")


@pytest.mark.parametrize(
    "requested, pattern",
    [
        ("nonsense", r"got 'nonsense', expected a device name such as 'cpu', 'cuda'"),
        ("cuda:1000", r"got 'cuda:1000', but that device is not available on this machine"),
    ],
)
def test_get_device_raises_for_unknown_or_absent_devices(no_env, requested, pattern):
    with pytest.raises(ValueError, match="prefer: " + pattern):
        get_device(requested)
    no_env.setenv(ENV_VAR, requested)
    with pytest.raises(ValueError, match=f"environment variable {ENV_VAR}: " + pattern):
        get_device("cpu")


@pytest.mark.skipif(
    getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available(),
    reason="this machine has MPS",
)
def test_get_device_raises_for_mps_where_there_is_none(no_env):
    with pytest.raises(ValueError, match="MPS available: False"):
        get_device("mps")


# --- seed_everything ----------------------------------------------------------------------


def draws():
    return (
        [random.random() for _ in range(3)],
        np.random.rand(3).tolist(),
        torch.rand(3).tolist(),
        torch.randint(0, 1000, (3,)).tolist(),
    )


def test_seed_everything_makes_python_numpy_and_torch_repeat():
    seed_everything(123)
    first = draws()
    seed_everything(123)
    assert draws() == first
    seed_everything(124)
    other = draws()
    assert all(a != b for a, b in zip(other, first))  # each generator was reseeded


def test_seed_everything_accepts_large_and_negative_seeds():
    for seed in (2**40, -5):
        seed_everything(seed)
        first = draws()
        seed_everything(seed)
        assert draws() == first
    seed_everything(0)
    assert np.random.rand() == np.random.RandomState(0).rand()


# --- the command line ---------------------------------------------------------------------


def test_doctor_without_a_book(no_env, tmp_path, capsys):
    no_env.chdir(tmp_path)
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert f"torch         {torch.__version__}" in out
    assert f"device        {automatic_choice()}" in out
    assert "book          no _config.yml/_toc.yml found above the current folder" in out


def write_book(root, chapters):
    (root / "_config.yml").write_text("title: test\n")
    toc = "format: jb-book\nroot: intro\nchapters:\n" + "".join(f"- file: {c}\n" for c in chapters)
    (root / "_toc.yml").write_text(toc)
    (root / "intro.md").write_text("# Intro\n")


def test_doctor_finds_the_book_above_the_current_folder(no_env, tmp_path, capsys):
    write_book(tmp_path, ["book/one"])
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "one.ipynb").write_text("{}")
    no_env.chdir(tmp_path / "book")
    assert main(["doctor"]) == 0
    assert "book          sources in place (2 pages in _toc.yml)" in capsys.readouterr().out


def test_doctor_reports_missing_chapters(no_env, tmp_path, capsys):
    write_book(tmp_path, ["book/one", "book/two"])
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "one.md").write_text("# One\n")
    no_env.chdir(tmp_path)
    assert main(["doctor"]) == 1
    assert "MISSING chapters listed in _toc.yml: book/two" in capsys.readouterr().out


def test_doctor_reports_a_bad_device_setting(no_env, tmp_path, capsys):
    no_env.chdir(tmp_path)
    no_env.setenv(ENV_VAR, "nonsense")
    assert main(["doctor"]) == 1
    assert f"device        ERROR: environment variable {ENV_VAR}" in capsys.readouterr().out


def test_cli_needs_a_subcommand(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    assert "doctor" in capsys.readouterr().err


def test_cli_prints_its_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    version = importlib.metadata.version("attention-course")
    assert capsys.readouterr().out.strip() == f"attention-course {version}"


def test_doctor_reports_a_missing_jupyter_lab(no_env, tmp_path, capsys, monkeypatch):
    """The README's `jupyter lab book/` failed while doctor said everything was in place."""
    import attention_course.cli as cli

    no_env.chdir(tmp_path)
    monkeypatch.setattr(cli.sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setattr(cli.shutil, "which", lambda name: None)
    assert main(["doctor"]) == 1
    assert "jupyter lab   MISSING" in capsys.readouterr().out


def test_doctor_finds_jupyter_lab_beside_python(no_env, tmp_path, capsys, monkeypatch):
    import attention_course.cli as cli

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "jupyter-lab").write_text("")
    no_env.chdir(tmp_path)
    monkeypatch.setattr(cli.sys, "executable", str(tmp_path / "bin" / "python"))
    assert main(["doctor"]) == 0
    assert "jupyter lab   found" in capsys.readouterr().out


def test_a_device_index_that_torch_wraps_is_not_available(no_env, monkeypatch):
    """torch stores a device index in 8 bits: on a CUDA machine torch.device("cuda:1000") is
    cuda:-24, which an `index < device_count` test accepted (found on an H200)."""
    import attention_course.device as device_module

    class WrappedDevice:  # what torch.device("cuda:1000") gave there
        type, index = "cuda", -24

    real = torch.device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(
        device_module.torch,
        "device",
        lambda spec: WrappedDevice() if spec == "cuda:1000" else real(spec),
    )
    with pytest.raises(ValueError, match="not available on this machine"):
        get_device("cuda:1000")
