"""What each language calls the symbols, currencies and months a transcript writes, and how it
writes ordinals and decimals: the tables :func:`speechdata.alignment.text_normalization.spoken_form`
reads (en, de, fr, es; other languages get numbers only).
"""

from __future__ import annotations

ORDINAL_SUFFIXES = {
    "en": r"st|nd|rd|th",
    "fr": r"er|re|ère|ème|eme|e",
    "es": r"\.?º|\.?ª|o|a",
}

SYMBOL_CHARACTERS = "$€£¥%&+@=#°"

CURRENCY_SYMBOLS = {"$": "USD", "€": "EUR", "£": "GBP", "¥": "JPY"}
CURRENCY_CODES = frozenset({"USD", "EUR", "GBP", "JPY", "CHF"})

# (singular, plural) of each currency, and of its hundredth ("cent", or "cent:<code>" where it has its own name).
CURRENCY_NAMES: dict[str, dict[str, tuple[str, str]]] = {
    "en": {
        "USD": ("dollar", "dollars"),
        "EUR": ("euro", "euros"),
        "GBP": ("pound", "pounds"),
        "JPY": ("yen", "yen"),
        "CHF": ("franc", "francs"),
        "cent": ("cent", "cents"),
        "cent:GBP": ("penny", "pence"),
    },
    "de": {
        "USD": ("dollar", "dollar"),
        "EUR": ("euro", "euro"),
        "GBP": ("pfund", "pfund"),
        "JPY": ("yen", "yen"),
        "CHF": ("franken", "franken"),
        "cent": ("cent", "cent"),
        "cent:GBP": ("penny", "pence"),
    },
    "fr": {
        "USD": ("dollar", "dollars"),
        "EUR": ("euro", "euros"),
        "GBP": ("livre", "livres"),
        "JPY": ("yen", "yens"),
        "CHF": ("franc", "francs"),
        "cent": ("centime", "centimes"),
        "cent:GBP": ("penny", "pence"),
    },
    "es": {
        "USD": ("dólar", "dólares"),
        "EUR": ("euro", "euros"),
        "GBP": ("libra", "libras"),
        "JPY": ("yen", "yenes"),
        "CHF": ("franco", "francos"),
        "cent": ("céntimo", "céntimos"),
        "cent:GBP": ("penique", "peniques"),
    },
}

SYMBOL_NAMES: dict[str, dict[str, str]] = {
    "en": {"%": "percent", "&": "and", "+": "plus", "@": "at", "=": "equals", "#": "number", "°": "degrees"},
    "de": {"%": "prozent", "&": "und", "+": "plus", "@": "at", "=": "gleich", "#": "nummer", "°": "grad"},
    "fr": {"%": "pour cent", "&": "et", "+": "plus", "@": "arobase", "=": "égale", "#": "numéro", "°": "degrés"},
    "es": {"%": "por ciento", "&": "y", "+": "más", "@": "arroba", "=": "igual", "#": "número", "°": "grados"},
}

MONTHS: dict[str, tuple[str, ...]] = {
    "en": [
        "january",
        "february",
        "march",
        "april",
        "may",
        "june",
        "july",
        "august",
        "september",
        "october",
        "november",
        "december",
    ],
    "de": [
        "januar",
        "februar",
        "märz",
        "april",
        "mai",
        "juni",
        "juli",
        "august",
        "september",
        "oktober",
        "november",
        "dezember",
    ],
    "fr": [
        "janvier",
        "février",
        "mars",
        "avril",
        "mai",
        "juin",
        "juillet",
        "août",
        "septembre",
        "octobre",
        "novembre",
        "décembre",
    ],
    "es": [
        "enero",
        "febrero",
        "marzo",
        "abril",
        "mayo",
        "junio",
        "julio",
        "agosto",
        "septiembre",
        "octubre",
        "noviembre",
        "diciembre",
    ],
}

DECIMAL_COMMA_LANGUAGES = frozenset({"de", "fr", "es", "it", "pt", "nl", "pl", "ru", "cs", "da", "sv", "nb", "fi"})
"""Languages that write ``1.000,5``; the others write ``1,000.5``."""
