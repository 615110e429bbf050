"""Tenancy: tenant registry, key ring, tokenizer, HMAC block-hash chain, cache salt, limits.

Never imports ``gateway``.
"""
