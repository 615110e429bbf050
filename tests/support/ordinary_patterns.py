"""Ordinary JSON-schema ``pattern`` strings (dates, times, emails, UUIDs, phone numbers, ISO codes, semver, URLs with
bounded parts, ...), written by hand after common validators and the schemas clients send, and the automaton
blow-up family of S28-attack28-2 (written in session 28, pattern28, S28-pattern28-1, branch s28-pattern28; kept
here since session 29, pattern29, for ``limits.json_schema.quote_reading_patterns``: which ordinary patterns read the
string's closing quote, tests/gateway/test_s29_pattern29_pattern_quote.py; docs/benchmarks.md "Session 29:
pattern29")."""

from __future__ import annotations

ORDINARY: dict[str, str] = {
    'date': '^\\d{4}-\\d{2}-\\d{2}$',
    'date strict': '^\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])$',
    'time': '^([01]\\d|2[0-3]):[0-5]\\d(:[0-5]\\d(\\.\\d{1,6})?)?$',
    'datetime': '^\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}(\\.\\d{1,9})?(Z|[+-]\\d{2}:\\d{2})$',
    'email': '^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\\.[A-Za-z]{2,}$',
    'email bounded': '^[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\\.[A-Za-z0-9-]{1,63}){1,8}$',
    'email simple': '^[^@\\s]+@[^@\\s]+\\.[^@\\s]+$',
    'email w': '^[\\w.-]+@[\\w-]+\\.[\\w.-]+$',
    'uuid': '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$',
    'uuid v4': '^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$',
    'phone e164': '^\\+?[1-9]\\d{1,14}$',
    'phone us': '^\\(?\\d{3}\\)?[-. ]?\\d{3}[-. ]?\\d{4}$',
    'phone intl': '^\\+?[0-9 ()\\-]{7,20}$',
    'iso country': '^[A-Z]{2}$',
    'iso currency': '^[A-Z]{3}$',
    'iso language': '^[a-z]{2,3}(-[A-Z]{2})?$',
    'semver': (r'^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)'
               r'(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$'),
    'semver simple': '^\\d+\\.\\d+\\.\\d+$',
    'url bounded': '^https?://[a-z0-9.-]{1,253}(:[0-9]{1,5})?(/[A-Za-z0-9._~-]{0,64}){0,16}$',
    'url simple': '^https?://[^\\s/$.?#].[^\\s]*$',
    'url escaped': "^https?:\\/\\/[\\w.-]+(?:\\.[\\w.-]+)+[\\w\\-._~:/?#\\[\\]@!$&'()*+,;=]*$",
    'ipv4': '^((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.){3}(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)$',
    'zip us': '^\\d{5}(-\\d{4})?$',
    'postcode uk': '^[A-Z]{1,2}\\d[A-Z\\d]? ?\\d[A-Z]{2}$',
    'hex color': '^#([A-Fa-f0-9]{6}|[A-Fa-f0-9]{3})$',
    'slug': '^[a-z0-9]+(?:-[a-z0-9]+)*$',
    'username': '^[a-zA-Z0-9_]{3,32}$',
    'sku': '^[A-Z]{3}-\\d{4,8}$',
    'iban': '^[A-Z]{2}\\d{2}[A-Z0-9]{11,30}$',
    'credit card': '^\\d{4}[- ]?\\d{4}[- ]?\\d{4}[- ]?\\d{1,7}$',
    'month name': '^(January|February|March|April|May|June|July|August|September|October|November|December)$',
    'duration iso': '^P(\\d+Y)?(\\d+M)?(\\d+D)?(T(\\d+H)?(\\d+M)?(\\d+(\\.\\d+)?S)?)?$',
    'decimal': '^-?\\d+(\\.\\d{1,2})?$',
    'percent': '^(100|[1-9]?\\d)(\\.\\d+)?%$',
    'name': '^[A-Z][a-z]+( [A-Z][a-z]+)*$',
    'free text 1-200': '^.{1,200}$',
    'non empty': '^\\S.*$',
    'isbn13': '^97[89]-?\\d{1,5}-?\\d{1,7}-?\\d{1,7}-?\\d$',
    'mac': '^([0-9A-Fa-f]{2}[:-]){5}[0-9A-Fa-f]{2}$',
    'ipv6 simple': '^([0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}$',
    'jwt': '^[A-Za-z0-9_-]+\\.[A-Za-z0-9_-]+\\.[A-Za-z0-9_-]*$',
    'base64': '^[A-Za-z0-9+/]*={0,2}$',
    'file path': '^(/[^/\\0]{1,255}){1,32}$',
    'ticket': '^[A-Z][A-Z0-9]{1,9}-\\d{1,6}$',
    'lat': '^-?([1-8]?\\d(\\.\\d{1,8})?|90(\\.0{1,8})?)$',
    'version tag': '^v\\d+(\\.\\d+){0,3}(-[a-z0-9.]+)?$',
}

#: outlines-core determinises each into ~2**k states or more (S28-attack28-2: ".*a" + 16 dots, 14.4 s and 423 MB)
BLOWUP: dict[str, str] = {
    '.*a + 13 dots': '.*a' + '.' * 13,
    '.*a + 16 dots': '.*a' + '.' * 16,
    '.*a + 20 dots': '.*a' + '.' * 20,
    '[ab]*a + 20 [ab]': '[ab]*a' + '[ab]' * 20,
    '.*a.{16}': '.*a.{16}',
    '(.*a){2}.{14}': '(.*a){2}.{14}',
    '.*\\/ + 14 dots (an escape greenery 4.2 lacks)': '.*\\/' + '.' * 14,
    '[\\w.-]*a[\\w.-]{14} (a class greenery 4.2 lacks)': '[\\w.-]*a[\\w.-]{14}',
    '.{0,20}a.{14}': '.{0,20}a.{14}',
    'nested 150 .*a.{16}': '(' * 150 + '.*a.{16}' + ')' * 150,
}
