"""environment.yml (conda) and pyproject.toml (pip) list the same packages."""

import re
import tomllib

from minitp.course.paths import repo_root

CONDA_TO_PIP = {"pytorch": "torch"}  # conda-forge names that differ from PyPI's


def _split(requirement: str) -> tuple[str, str]:
    match = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", requirement)
    return match.group(1).lower(), match.group(2).replace(" ", "")


def _pyproject() -> dict[str, str]:
    project = tomllib.loads((repo_root() / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + project["optional-dependencies"]["dev"]
    return dict(_split(r) for r in requirements)


def _environment() -> tuple[dict[str, str], list[str]]:
    conda, pip = {}, []
    in_pip = False
    text = (repo_root() / "environment.yml").read_text()
    for line in text.partition("\ndependencies:\n")[2].splitlines():
        item = re.match(r"^(\s*)- (.+)$", line)
        if not item:
            in_pip = in_pip and line.startswith("      ")
            continue
        indent, value = len(item.group(1)), item.group(2).strip()
        if value == "pip:":
            in_pip = True
        elif in_pip and indent > 2:
            pip.append(value)
        else:
            in_pip = False
            name, spec = _split(value)
            conda[CONDA_TO_PIP.get(name, name)] = spec
    return conda, pip


def test_environment_yml_lists_the_pyproject_packages():
    conda, pip = _environment()
    assert conda.pop("python") == "=3.11"
    conda.pop("pip")
    assert conda == _pyproject()


def test_environment_yml_installs_this_package_with_dev_extras():
    _, pip = _environment()
    assert pip == ["-e .[dev]"]


def test_every_dependency_has_the_lower_bound_the_suite_passed_with():
    """An open requirement lets a machine keep any old release it already has (an old
    cloudpickle once hid a bug every new install had); each lower bound is a version
    the whole suite has passed with (README, "Dependencies")."""
    for name, spec in _pyproject().items():
        assert re.fullmatch(r">=\d+(\.\d+)*", spec), f"{name}: {spec!r} is not a lower bound"
