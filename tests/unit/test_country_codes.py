"""The landing contract's country table: ISO 3166-1 alpha-2 codes, and names mapped to them."""

import pytest

from speechdata.landing.countries import (
    ISO_3166_ALPHA2,
    UnknownCountry,
    country_code_for,
    country_problem,
    is_country_code,
)


def test_the_table_holds_the_249_assigned_codes_lowercase():
    assert len(ISO_3166_ALPHA2) == 249
    assert all(len(code) == 2 and code.islower() for code in ISO_3166_ALPHA2)
    assert {"fr", "de", "at", "gb", "us", "mx", "es"} <= set(ISO_3166_ALPHA2)
    assert not is_country_code("uk") and not is_country_code("FR") and not is_country_code("france")


@pytest.mark.parametrize(
    ("value", "code"),
    [
        ("france", "fr"),
        ("Germany", "de"),
        ("austria", "at"),
        ("united_kingdom", "gb"),
        ("United States", "us"),
        ("new-zealand", "nz"),
        ("south_korea", "kr"),
        ("uk", "gb"),
        ("FR", "fr"),
        ("fr", "fr"),
    ],
)
def test_a_country_name_or_a_code_in_any_case_maps_to_its_code(value, code):
    assert country_code_for(value) == code


def test_a_value_that_is_no_country_is_an_error_naming_it():
    with pytest.raises(UnknownCountry, match="'atlantis' is neither an ISO 3166-1 alpha-2 code"):
        country_code_for("atlantis")
    assert country_problem("fr") is None
    assert country_problem("france").endswith("use 'fr'")
    assert "use '" not in country_problem("zz")
