"""Pickers: choose one eligible candidate and say why.

* :mod:`routing.pickers.round_robin`: rotation over the ids;
* :mod:`routing.pickers.least_load`: fewest token load, then requests;
* :mod:`routing.pickers.lowest_cost`: lowest summed cost, then longest prefix;
* :mod:`routing.pickers.ring`: first eligible owner on a consistent-hash ring;
* :mod:`routing.pickers.fewest_requests`: fewest running requests.

Ties end on a rendezvous hash of the request's prefix, then the id.
"""

from __future__ import annotations

from routing.pickers.fewest_requests import FewestRequestsPicker
from routing.pickers.least_load import LeastLoadPicker
from routing.pickers.lowest_cost import LowestCostPicker
from routing.pickers.ring import RingPicker
from routing.pickers.round_robin import RoundRobinPicker

__all__ = ["FewestRequestsPicker", "LeastLoadPicker", "LowestCostPicker", "RingPicker", "RoundRobinPicker"]
