"""PrefixGate package."""
