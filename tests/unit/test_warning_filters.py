"""The warning filters in pyproject.toml: a deprecated call in our packages fails the test that reaches
it; one in a third-party package shows in the summary."""

import warnings

import pytest

OUR_PACKAGES = ["speechdata", "assets", "resources", "sensors", "dagster_project"]


def warn_from(module: str, message: str = "this call is deprecated") -> None:
    warnings.warn_explicit(
        message, DeprecationWarning, filename=f"{module.replace('.', '/')}.py", lineno=1, module=module
    )


@pytest.mark.parametrize("package", OUR_PACKAGES)
def test_a_deprecation_warning_raised_in_our_packages_is_an_error(package):
    with pytest.raises(DeprecationWarning, match="this call is deprecated"):
        warn_from(f"{package}.some_module")


def test_a_deprecation_warning_from_a_third_party_package_is_shown_not_raised():
    with pytest.warns(DeprecationWarning, match="this call is deprecated"):
        warn_from("some_library.module")
