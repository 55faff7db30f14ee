"""Which language a country's recordings are in, for importers whose sources are folders per country.

:data:`COUNTRY_LANGUAGES` maps a country code to the language of its recordings; a folder names its
country by code or name (``fr``, ``france``, ``united_kingdom``), turned into the code by the landing
contract's table (:mod:`speechdata.landing.countries`).
"""

from __future__ import annotations

from collections.abc import Mapping

from speechdata.landing.countries import UnknownCountry, country_code_for, suggested_code

COUNTRY_LANGUAGES: dict[str, str] = {
    "ar": "es",
    "at": "de",
    "au": "en",
    "bd": "bn",
    "bg": "bg",
    "br": "pt",
    "ca": "en",
    "cl": "es",
    "cn": "zh",
    "co": "es",
    "cz": "cs",
    "de": "de",
    "dk": "da",
    "ee": "et",
    "eg": "ar",
    "es": "es",
    "fi": "fi",
    "fr": "fr",
    "gb": "en",
    "gr": "el",
    "hr": "hr",
    "hu": "hu",
    "id": "id",
    "ie": "en",
    "il": "he",
    "in": "hi",
    "ir": "fa",
    "it": "it",
    "jp": "ja",
    "ke": "sw",
    "kr": "ko",
    "lt": "lt",
    "lv": "lv",
    "mx": "es",
    "my": "ms",
    "ng": "en",
    "nl": "nl",
    "no": "no",
    "nz": "en",
    "pe": "es",
    "ph": "tl",
    "pk": "ur",
    "pl": "pl",
    "pt": "pt",
    "ro": "ro",
    "rs": "sr",
    "ru": "ru",
    "sa": "ar",
    "se": "sv",
    "si": "sl",
    "sk": "sk",
    "th": "th",
    "tr": "tr",
    "tw": "zh",
    "ua": "uk",
    "us": "en",
    "vn": "vi",
    "za": "en",
}
"""Country code (ISO 3166-1 alpha-2) -> ISO 639-1 language of its recordings (the corpus tooling's
``utils.py`` map, its country names turned into codes).

Countries with several official languages map to the language their recordings are in for this
corpus; pass ``country_languages`` to :func:`import_aligned_countries` to override or extend (keys
may be codes or country names)."""


class UnknownCountryError(ValueError):
    """A country folder that is no country (not a code nor a known name), or whose country the
    country-to-language map does not name."""

    def __init__(self, country: str, mapping: Mapping[str, str], code: str | None = None):
        known = ", ".join(f"{c}={lang}" for c, lang in sorted(mapping.items()))
        if code is None:
            problem = (
                f"country {country!r} is neither an ISO 3166-1 alpha-2 code nor a known country name "
                "(speechdata/landing/countries.py)"
            )
        else:
            problem = (
                f"country {country!r} ({code!r}) has no language in the country-to-language map; add it with "
                f"country_languages={{{code!r}: '<iso 639-1>'}}"
            )
        super().__init__(f"{problem}. Known: {known}" if known else problem)
        self.country, self.code = country, code


def country_code_of_folder(folder: str, mapping: Mapping[str, str] = COUNTRY_LANGUAGES) -> str:
    """The ISO 3166-1 alpha-2 code a country folder (``france``, ``united_kingdom``, ``fr``) lands under."""
    try:
        return country_code_for(folder)
    except UnknownCountry:
        raise UnknownCountryError(folder, codes_of(mapping)) from None


def language_for_country(country: str, mapping: Mapping[str, str] = COUNTRY_LANGUAGES) -> str:
    """The language of a country, given by code or name; ``mapping``'s keys may be codes or names."""
    by_code = codes_of(mapping)
    code = country_code_of_folder(country, mapping)
    try:
        return by_code[code]
    except KeyError:
        raise UnknownCountryError(country, by_code, code) from None


def codes_of(mapping: Mapping[str, str]) -> dict[str, str]:
    """``mapping`` with every key (a code or a country name) turned into its code; a key that is no
    country is an error naming it (an override that could never apply is a mistake, not a no-op)."""
    by_code = {}
    for key, language in mapping.items():
        code = suggested_code(key)
        if code is None:
            raise UnknownCountryError(key, {})
        by_code[code] = language
    return by_code
