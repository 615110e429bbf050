"""Pure routing logic: prefix index, load tracker, router and policies.

No I/O and no import of ``gateway``: the gateway and the offline simulator
(``sim/des.py``) both drive it. See docs/routing.md.
"""
