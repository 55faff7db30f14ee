"""The landing contract's country codes: ISO 3166-1 alpha-2, lowercase, from a fixed table.

Every ``country`` value on the platform (landed metadata, the ``country`` partitions, the catalog,
the Hugging Face configs) is one of :data:`ISO_3166_ALPHA2`. A country *name* (``france``,
``United Kingdom``) is never a value: :func:`country_code_for` maps a name or a code to the code
(importers whose sources name countries use it), and :func:`country_problem` says what is wrong
with a value, suggesting the code when the value is a known name.
"""

from __future__ import annotations

import re

ISO_3166_ALPHA2: dict[str, str] = {
    "ad": "Andorra", "ae": "United Arab Emirates", "af": "Afghanistan", "ag": "Antigua and Barbuda",
    "ai": "Anguilla", "al": "Albania", "am": "Armenia", "ao": "Angola", "aq": "Antarctica",
    "ar": "Argentina", "as": "American Samoa", "at": "Austria", "au": "Australia", "aw": "Aruba",
    "ax": "Aland Islands", "az": "Azerbaijan", "ba": "Bosnia and Herzegovina", "bb": "Barbados",
    "bd": "Bangladesh", "be": "Belgium", "bf": "Burkina Faso", "bg": "Bulgaria", "bh": "Bahrain",
    "bi": "Burundi", "bj": "Benin", "bl": "Saint Barthelemy", "bm": "Bermuda", "bn": "Brunei",
    "bo": "Bolivia", "bq": "Bonaire, Sint Eustatius and Saba", "br": "Brazil", "bs": "Bahamas",
    "bt": "Bhutan", "bv": "Bouvet Island", "bw": "Botswana", "by": "Belarus", "bz": "Belize",
    "ca": "Canada", "cc": "Cocos (Keeling) Islands", "cd": "Democratic Republic of the Congo",
    "cf": "Central African Republic", "cg": "Republic of the Congo", "ch": "Switzerland",
    "ci": "Cote d'Ivoire", "ck": "Cook Islands", "cl": "Chile", "cm": "Cameroon", "cn": "China",
    "co": "Colombia", "cr": "Costa Rica", "cu": "Cuba", "cv": "Cabo Verde", "cw": "Curacao",
    "cx": "Christmas Island", "cy": "Cyprus", "cz": "Czechia", "de": "Germany", "dj": "Djibouti",
    "dk": "Denmark", "dm": "Dominica", "do": "Dominican Republic", "dz": "Algeria", "ec": "Ecuador",
    "ee": "Estonia", "eg": "Egypt", "eh": "Western Sahara", "er": "Eritrea", "es": "Spain",
    "et": "Ethiopia", "fi": "Finland", "fj": "Fiji", "fk": "Falkland Islands", "fm": "Micronesia",
    "fo": "Faroe Islands", "fr": "France", "ga": "Gabon", "gb": "United Kingdom", "gd": "Grenada",
    "ge": "Georgia", "gf": "French Guiana", "gg": "Guernsey", "gh": "Ghana", "gi": "Gibraltar",
    "gl": "Greenland", "gm": "Gambia", "gn": "Guinea", "gp": "Guadeloupe", "gq": "Equatorial Guinea",
    "gr": "Greece", "gs": "South Georgia and the South Sandwich Islands", "gt": "Guatemala",
    "gu": "Guam", "gw": "Guinea-Bissau", "gy": "Guyana", "hk": "Hong Kong",
    "hm": "Heard Island and McDonald Islands", "hn": "Honduras", "hr": "Croatia", "ht": "Haiti",
    "hu": "Hungary", "id": "Indonesia", "ie": "Ireland", "il": "Israel", "im": "Isle of Man",
    "in": "India", "io": "British Indian Ocean Territory", "iq": "Iraq", "ir": "Iran", "is": "Iceland",
    "it": "Italy", "je": "Jersey", "jm": "Jamaica", "jo": "Jordan", "jp": "Japan", "ke": "Kenya",
    "kg": "Kyrgyzstan", "kh": "Cambodia", "ki": "Kiribati", "km": "Comoros",
    "kn": "Saint Kitts and Nevis", "kp": "North Korea", "kr": "South Korea", "kw": "Kuwait",
    "ky": "Cayman Islands", "kz": "Kazakhstan", "la": "Laos", "lb": "Lebanon", "lc": "Saint Lucia",
    "li": "Liechtenstein", "lk": "Sri Lanka", "lr": "Liberia", "ls": "Lesotho", "lt": "Lithuania",
    "lu": "Luxembourg", "lv": "Latvia", "ly": "Libya", "ma": "Morocco", "mc": "Monaco",
    "md": "Moldova", "me": "Montenegro", "mf": "Saint Martin", "mg": "Madagascar",
    "mh": "Marshall Islands", "mk": "North Macedonia", "ml": "Mali", "mm": "Myanmar",
    "mn": "Mongolia", "mo": "Macao", "mp": "Northern Mariana Islands", "mq": "Martinique",
    "mr": "Mauritania", "ms": "Montserrat", "mt": "Malta", "mu": "Mauritius", "mv": "Maldives",
    "mw": "Malawi", "mx": "Mexico", "my": "Malaysia", "mz": "Mozambique", "na": "Namibia",
    "nc": "New Caledonia", "ne": "Niger", "nf": "Norfolk Island", "ng": "Nigeria", "ni": "Nicaragua",
    "nl": "Netherlands", "no": "Norway", "np": "Nepal", "nr": "Nauru", "nu": "Niue",
    "nz": "New Zealand", "om": "Oman", "pa": "Panama", "pe": "Peru", "pf": "French Polynesia",
    "pg": "Papua New Guinea", "ph": "Philippines", "pk": "Pakistan", "pl": "Poland",
    "pm": "Saint Pierre and Miquelon", "pn": "Pitcairn", "pr": "Puerto Rico", "ps": "Palestine",
    "pt": "Portugal", "pw": "Palau", "py": "Paraguay", "qa": "Qatar", "re": "Reunion",
    "ro": "Romania", "rs": "Serbia", "ru": "Russia", "rw": "Rwanda", "sa": "Saudi Arabia",
    "sb": "Solomon Islands", "sc": "Seychelles", "sd": "Sudan", "se": "Sweden", "sg": "Singapore",
    "sh": "Saint Helena, Ascension and Tristan da Cunha", "si": "Slovenia",
    "sj": "Svalbard and Jan Mayen", "sk": "Slovakia", "sl": "Sierra Leone", "sm": "San Marino",
    "sn": "Senegal", "so": "Somalia", "sr": "Suriname", "ss": "South Sudan",
    "st": "Sao Tome and Principe", "sv": "El Salvador", "sx": "Sint Maarten", "sy": "Syria",
    "sz": "Eswatini", "tc": "Turks and Caicos Islands", "td": "Chad",
    "tf": "French Southern Territories", "tg": "Togo", "th": "Thailand", "tj": "Tajikistan",
    "tk": "Tokelau", "tl": "Timor-Leste", "tm": "Turkmenistan", "tn": "Tunisia", "to": "Tonga",
    "tr": "Turkey", "tt": "Trinidad and Tobago", "tv": "Tuvalu", "tw": "Taiwan", "tz": "Tanzania",
    "ua": "Ukraine", "ug": "Uganda", "um": "United States Minor Outlying Islands",
    "us": "United States", "uy": "Uruguay", "uz": "Uzbekistan", "va": "Holy See",
    "vc": "Saint Vincent and the Grenadines", "ve": "Venezuela", "vg": "British Virgin Islands",
    "vi": "United States Virgin Islands", "vn": "Vietnam", "vu": "Vanuatu",
    "wf": "Wallis and Futuna", "ws": "Samoa", "ye": "Yemen", "yt": "Mayotte", "za": "South Africa",
    "zm": "Zambia", "zw": "Zimbabwe",
}  # fmt: skip
"""The 249 officially assigned ISO 3166-1 alpha-2 codes (lowercase) and each country's short English name."""

OTHER_NAMES: dict[str, str] = {
    "usa": "us",
    "united_states_of_america": "us",
    "america": "us",
    "uk": "gb",
    "great_britain": "gb",
    "britain": "gb",
    "england": "gb",
    "scotland": "gb",
    "wales": "gb",
    "northern_ireland": "gb",
    "korea": "kr",
    "republic_of_korea": "kr",
    "czech_republic": "cz",
    "turkiye": "tr",
    "viet_nam": "vn",
    "russian_federation": "ru",
    "holland": "nl",
    "the_netherlands": "nl",
    "ivory_coast": "ci",
    "cape_verde": "cv",
    "swaziland": "sz",
    "burma": "mm",
    "macedonia": "mk",
    "east_timor": "tl",
    "vatican": "va",
    "vatican_city": "va",
    "congo": "cg",
    "drc": "cd",
    "uae": "ae",
    "persia": "ir",
    "deutschland": "de",
    "espana": "es",
    "osterreich": "at",
    "schweiz": "ch",
    "italia": "it",
    "nippon": "jp",
}
"""Names people and corpora use for a country that are not its short English name (``uk`` is
reserved, not assigned: the United Kingdom's code is ``gb``)."""


def _name_key(name: str) -> str:
    """``"United Kingdom"``, ``united-kingdom`` and ``united_kingdom`` alike: lowercase, words joined by ``_``."""
    return "_".join(re.findall(r"[a-z0-9]+", name.lower().replace("'", "")))


CODES_BY_NAME: dict[str, str] = {
    **{_name_key(name): code for code, name in ISO_3166_ALPHA2.items()},
    **OTHER_NAMES,
}
"""Normalized country name -> its code (see :func:`country_code_for`)."""


def is_country_code(value: object) -> bool:
    """Whether ``value`` is a lowercase ISO 3166-1 alpha-2 code of :data:`ISO_3166_ALPHA2`."""
    return isinstance(value, str) and value in ISO_3166_ALPHA2


def suggested_code(value: str) -> str | None:
    """The code of a known country name or of an upper-case code (``France``, ``FR`` -> ``fr``), else None."""
    if value.lower() in ISO_3166_ALPHA2:
        return value.lower()
    return CODES_BY_NAME.get(_name_key(value))


def country_problem(value: str) -> str | None:
    """None for a valid code; else why ``value`` is not one, with the code to use when it is known."""
    if is_country_code(value):
        return None
    problem = f"{value!r} is not a lowercase ISO 3166-1 alpha-2 country code"
    code = suggested_code(value)
    return f"{problem}: use {code!r}" if code else f"{problem} (e.g. 'fr', 'de', 'us')"


class UnknownCountry(ValueError):
    """A country value that is neither a code nor a name of the table."""


def country_code_for(name_or_code: str) -> str:
    """The code for a country code in any case or a known name (``france``, ``United States``).

    Importers whose sources name countries (folder names, a ``--country`` option) call this, so
    every landed value is a code. Raises :class:`UnknownCountry` naming the value otherwise.
    """
    code = suggested_code(name_or_code)
    if code is None:
        raise UnknownCountry(
            f"country {name_or_code!r} is neither an ISO 3166-1 alpha-2 code nor a country name this table knows "
            "(speechdata/landing/countries.py)"
        )
    return code
