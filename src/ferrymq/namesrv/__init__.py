"""The name server: route registry (``route_table``), request handlers (``processors``), KV config and the
``NameServer`` app."""

from ferrymq.namesrv.app import NameServer
from ferrymq.namesrv.route_table import RouteTable

__all__ = ["NameServer", "RouteTable"]
