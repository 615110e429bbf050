"""A demo JWT-SVID issuer: the stand-in for a SPIRE server in demos, replays and tests.

It holds asymmetric signing keys for one trust domain, publishes them as a
SPIFFE bundle (JWK Set with ``use: "jwt-svid"``, ``kid`` and
``spiffe_sequence``; SPIFFE Trust Domain and Bundle spec section 4) and mints
JWT-SVIDs (JWT-SVID spec section 3: ``sub`` = SPIFFE ID, ``aud``, ``exp``,
``iat``; header ``alg``, ``kid``, ``typ: JWT``).

Not a production issuer. Keys live in memory, unless the issuer is saved to
a trust-domain directory (:func:`create_trust_domain`, :func:`load_trust_domain`;
``prefixgate-sim trust-domain create`` / ``prefixgate-sim token``): then the
signing keys stay stable across runs, so every token minted from that
directory keeps verifying against its bundle. Layout::

    DIR/trust-domain.json     {"trust_domain", "alg", "sequence", "kids": [...]}
    DIR/keys/<kid>.pem        PKCS#8 private signing keys (mode 0600)
    DIR/bundle.json           the SPIFFE bundle (public keys) the gateway reads
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm, RSAPSSAlgorithm

from audit.atomic_file import write_atomic

_CURVES = {"ES256": ec.SECP256R1, "ES384": ec.SECP384R1, "ES512": ec.SECP521R1}
_RSA_ALGS = {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"}


@dataclass
class _SigningKey:
    kid: str
    alg: str
    private_key: Any


def _new_key(alg: str) -> Any:
    if alg in _CURVES:
        return ec.generate_private_key(_CURVES[alg]())
    if alg in _RSA_ALGS:
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    raise ValueError(f"unsupported JWT-SVID algorithm {alg!r}")


def public_jwk(private_key: Any, alg: str) -> dict[str, Any]:
    """The public JWK (dict) of a private key, without ``use``/``kid``."""
    if alg in _CURVES:
        return json.loads(ECAlgorithm.to_jwk(private_key.public_key()))
    cls = RSAPSSAlgorithm if alg.startswith("PS") else RSAAlgorithm
    return json.loads(cls.to_jwk(private_key.public_key()))


class DemoIssuer:
    """JWT-SVID issuer for one trust domain.

    ``alg``: one of ES256/384/512, RS256/384/512, PS256/384/512.
    ``publish_alg``: when true each bundle key also declares its ``alg``
    (SPIRE omits it; the verifier accepts both).
    """

    def __init__(self, trust_domain: str, alg: str = "ES256", *, publish_alg: bool = False) -> None:
        self.trust_domain = trust_domain
        self.alg = alg
        self.publish_alg = publish_alg
        self.sequence = 1
        self.refresh_hint_s = 60
        self._keys: list[_SigningKey] = [self._make_key()]

    def _make_key(self) -> _SigningKey:
        return _SigningKey(kid=secrets.token_urlsafe(12), alg=self.alg, private_key=_new_key(self.alg))

    @property
    def kid(self) -> str:
        """The kid of the current signing key."""
        return self._keys[-1].kid

    @property
    def private_key(self) -> Any:
        """The current signing key (cryptography object), for negative tests."""
        return self._keys[-1].private_key

    def public_jwk(self, kid: str | None = None) -> dict[str, Any]:
        """The bundle JWK of key ``kid`` (default: current key)."""
        key = next(k for k in self._keys if k.kid == (kid or self.kid))
        jwk = public_jwk(key.private_key, key.alg)
        jwk.update({"use": "jwt-svid", "kid": key.kid})
        if self.publish_alg:
            jwk["alg"] = key.alg
        return jwk

    def bundle(self) -> dict[str, Any]:
        """The SPIFFE bundle JSON object: ``keys``, ``spiffe_sequence``, ``spiffe_refresh_hint``."""
        return {
            "keys": [self.public_jwk(k.kid) for k in self._keys],
            "spiffe_sequence": self.sequence,
            "spiffe_refresh_hint": self.refresh_hint_s,
        }

    def write_bundle(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`bundle` to ``path`` atomically, mode 0600 (:func:`audit.atomic_file.write_atomic`).

        Raises:
            OSError: the file could not be written (the old bundle stays in place).
        """
        write_atomic(path, json.dumps(self.bundle(), indent=2).encode("utf-8"))

    def mint(
        self,
        spiffe_id: str,
        audience: str | list[str],
        ttl_s: float = 300,
        *,
        headers: dict[str, Any] | None = None,
        now: float | None = None,
        **extra_claims: Any,
    ) -> str:
        """Mint a JWT-SVID for ``spiffe_id`` valid ``ttl_s`` seconds from ``now``.

        ``extra_claims`` are added (and may override ``iat``/``exp``; pass
        ``exp=None`` to drop a claim). ``headers`` are merged into the JOSE
        header (for tests of ``jku``, ``crit``...).
        """
        t = time.time() if now is None else now
        claims: dict[str, Any] = {
            "sub": spiffe_id,
            "aud": audience,
            "iat": int(t),
            "exp": int(t + ttl_s),
        }
        claims.update(extra_claims)
        claims = {k: v for k, v in claims.items() if v is not None}
        hdr: dict[str, Any] = {"kid": self.kid, "typ": "JWT"}
        hdr.update(headers or {})
        return jwt.encode(claims, self.private_key, algorithm=self.alg, headers=hdr)

    def rotate(self) -> str:
        """Add a new signing key (used from now on); the old one stays in the
        bundle until :meth:`drop_old`. Bumps ``spiffe_sequence``. Returns the new kid."""
        self._keys.append(self._make_key())
        self.sequence += 1
        return self.kid

    def drop_old(self) -> None:
        """Remove every key but the current one from the bundle; bumps the sequence."""
        self._keys = self._keys[-1:]
        self.sequence += 1


STATE_FILE = "trust-domain.json"
BUNDLE_FILE = "bundle.json"


class TrustDomainExists(FileExistsError):
    """Raised by :func:`create_trust_domain` when the directory already holds a trust domain
    (re-creating it would change the keys and invalidate every token minted from it)."""


def save_trust_domain(issuer: DemoIssuer, directory: str | os.PathLike[str]) -> Path:
    """Write ``issuer``'s keys (0600), state and bundle into ``directory``; return the bundle path."""
    from cryptography.hazmat.primitives import serialization

    root = Path(directory)
    keys = root / "keys"
    keys.mkdir(mode=0o700, parents=True, exist_ok=True)
    for k in issuer._keys:
        pem = k.private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption())
        path = keys / f"{k.kid}.pem"
        write_atomic(path, pem, mode=0o600)  # 0600 even over an existing file (O_CREAT's mode would not)
    state = {"trust_domain": issuer.trust_domain, "alg": issuer.alg, "sequence": issuer.sequence,
             "kids": [k.kid for k in issuer._keys]}
    (root / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    issuer.write_bundle(root / BUNDLE_FILE)
    return root / BUNDLE_FILE


def create_trust_domain(directory: str | os.PathLike[str], trust_domain: str, alg: str = "ES256") -> DemoIssuer:
    """Create a trust domain with one new signing key in ``directory`` (layout in the module docstring).

    Raises :class:`TrustDomainExists` if ``directory`` already holds one, and
    :class:`ValueError` for an unsupported ``alg`` or an invalid trust-domain name.
    """
    if not re.fullmatch(r"[a-z0-9._-]{1,255}", trust_domain):  # SPIFFE-ID spec 2.1
        raise ValueError(f"{trust_domain!r} is not a trust domain name (lower-case letters, digits, '.', '-', '_')")
    root = Path(directory)
    if (root / STATE_FILE).exists():
        raise TrustDomainExists(f"{root} already holds trust domain "
                                f"{json.loads((root / STATE_FILE).read_text())['trust_domain']!r}")
    issuer = DemoIssuer(trust_domain, alg=alg)
    save_trust_domain(issuer, root)
    return issuer


def load_trust_domain(directory: str | os.PathLike[str]) -> DemoIssuer:
    """Load the issuer saved in ``directory`` (its keys, in order; the last one signs).

    Raises :class:`FileNotFoundError` if there is none, :class:`ValueError` if
    it is malformed.
    """
    from cryptography.hazmat.primitives import serialization

    root = Path(directory)
    try:
        state = json.loads((root / STATE_FILE).read_text(encoding="utf-8"))
        issuer = DemoIssuer(state["trust_domain"], alg=state["alg"])
        keys = []
        for kid in state["kids"]:
            pem = (root / "keys" / f"{kid}.pem").read_bytes()
            keys.append(_SigningKey(kid=kid, alg=state["alg"],
                                    private_key=serialization.load_pem_private_key(pem, password=None)))
    except FileNotFoundError:
        raise FileNotFoundError(f"no trust domain in {root} (create one: prefixgate-sim trust-domain create)") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed trust domain in {root}: {exc}") from None
    if not keys:
        raise ValueError(f"malformed trust domain in {root}: no keys")
    issuer._keys = keys
    issuer.sequence = int(state.get("sequence", 1))
    return issuer
