"""A demo JWT-SVID issuer: the stand-in for a SPIRE server in demos, replays and tests.

It holds asymmetric signing keys for one trust domain, publishes them as a
SPIFFE bundle (JWK Set with ``use: "jwt-svid"``, ``kid`` and
``spiffe_sequence``; SPIFFE Trust Domain and Bundle spec section 4) and mints
JWT-SVIDs (JWT-SVID spec section 3: ``sub`` = SPIFFE ID, ``aud``, ``exp``,
``iat``; header ``alg``, ``kid``, ``typ: JWT``).

Not a production issuer: keys live in memory only.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm, RSAPSSAlgorithm

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
        """Write :meth:`bundle` to ``path`` atomically (temp file + rename)."""
        target = Path(path)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.bundle(), f, indent=2)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

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


def _cli() -> None:
    """``python -m sim.spiffe_issuer``: write a bundle and print JWT-SVIDs (one per --sub)."""
    import click

    @click.command()
    @click.option("--trust-domain", required=True, help="Trust domain name, e.g. prod.example")
    @click.option("--bundle", "bundle_path", required=True, type=click.Path(dir_okay=False),
                  help="Where to write the SPIFFE bundle (atomically)")
    @click.option("--sub", "subs", multiple=True, help="SPIFFE ID to mint a JWT-SVID for (repeatable)")
    @click.option("--aud", default="prefixgate", show_default=True, help="Audience")
    @click.option("--ttl", default=300.0, show_default=True, help="Token lifetime in seconds")
    @click.option("--alg", default="ES256", show_default=True, help="JWS algorithm")
    def main(trust_domain: str, bundle_path: str, subs: tuple[str, ...], aud: str, ttl: float, alg: str) -> None:
        iss = DemoIssuer(trust_domain, alg=alg)
        iss.write_bundle(bundle_path)
        for sub in subs:
            click.echo(f"{sub}\t{iss.mint(sub, aud, ttl_s=ttl)}")

    main()


if __name__ == "__main__":
    _cli()
